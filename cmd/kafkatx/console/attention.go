package console

import (
	"context"
	"fmt"
	"time"

	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/internal/tables"
)

// needsAttention lists the offset audit kinds and statuses an operator must not miss: a
// partition with such a row in the last AttentionWindow is highlighted on the partitions
// page and counted on the landing page. It is offsetstore.Kinds' kinds with an Attention
// (adding one is a line there), then the abandoned status; Kind or Status may be empty (any).
var needsAttention = func() []struct{ Kind, Status, Why string } {
	var out []struct{ Kind, Status, Why string }
	for _, k := range offsetstore.Kinds {
		if k.Attention != "" {
			out = append(out, struct{ Kind, Status, Why string }{Kind: k.Kind, Why: k.Attention})
		}
	}
	return append(out, struct{ Kind, Status, Why string }{Status: offsetstore.StatusAbandoned, Why: offsetstore.StatusAttention})
}()

// AttentionWindow is how far back the partitions page looks for audit rows that need
// attention.
const AttentionWindow = 7 * 24 * time.Hour

// Attention is one kind of audit row that needs attention on one partition.
type Attention struct {
	Kind   string    `json:"kind"`
	Status string    `json:"status"`
	Count  int       `json:"count"`
	Last   time.Time `json:"last_at"`
	Why    string    `json:"why"`
}

type tpKey struct {
	group, topic string
	partition    int32
}

// attentionOf reads, for groups, the audit rows of the last AttentionWindow that match
// needsAttention, by partition.
func (h *Handler) attentionOf(ctx context.Context, groups []string) (map[tpKey][]Attention, error) {
	kinds, statuses := []string{}, []string{}
	for _, a := range needsAttention {
		if a.Kind != "" {
			kinds = append(kinds, a.Kind)
		} else {
			statuses = append(statuses, a.Status)
		}
	}
	rows, err := h.cfg.Pool.Query(ctx, `SELECT group_id, topic, partition, kind, status, count(*), max(at)
		FROM `+tables.For(h.cfg.Schema).OffsetAudit+`
		WHERE group_id = ANY($1) AND at > now() - $2::interval AND (kind = ANY($3) OR status = ANY($4))
		GROUP BY 1, 2, 3, 4, 5 ORDER BY 1, 2, 3, 7 DESC`, groups, fmt.Sprintf("%d seconds", int(AttentionWindow.Seconds())), kinds, statuses)
	if err != nil {
		return nil, fmt.Errorf("audit rows that need attention: %w", err)
	}
	defer rows.Close()
	out := map[tpKey][]Attention{}
	for rows.Next() {
		var k tpKey
		var a Attention
		if err := rows.Scan(&k.group, &k.topic, &k.partition, &a.Kind, &a.Status, &a.Count, &a.Last); err != nil {
			return nil, fmt.Errorf("audit rows that need attention: %w", err)
		}
		a.Why = whyAttention(a.Kind, a.Status)
		out[k] = append(out[k], a)
	}
	return out, rows.Err()
}

func whyAttention(kind, status string) string {
	for _, a := range needsAttention {
		if a.Kind == kind && (a.Status == "" || a.Status == status) || a.Kind == "" && a.Status == status {
			return a.Why
		}
	}
	return ""
}
