package console

import (
	"context"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/offsets"
	"github.com/kafkatx/kafkatx/internal/offsetstate"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
)

// maxGroups bounds the consumer groups the partitions view compares (one Kafka round trip each).
const maxGroups = 200

// PartitionRow is one partition of one consumer group in GET /api/partitions: the fields of
// `kafkatx offsets status --output json`, with the offsets as numbers (-1 when none) and
// what the consumer will do at its next assignment.
type PartitionRow struct {
	Group     string `json:"group"`
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	// Watermark is the database's next offset to process; -1 when none is recorded.
	Watermark int64 `json:"watermark"`
	// Committed is the group's committed offset in Kafka; -1 when none.
	Committed int64 `json:"committed"`
	LogStart  int64 `json:"log_start"`
	LogEnd    int64 `json:"log_end"`
	// Lag is LogEnd minus the watermark (offsets status' rule), in records.
	Lag int64 `json:"lag"`
	// Drift is Committed minus Watermark (null when either is missing).
	Drift *int64 `json:"drift"`
	// State is the offset classifier's word (internal/offsetstate: aligned, kafka_ahead, ...).
	State string `json:"state"`
	// Drifted is true for the states offsets status counts as drift (exit status 3).
	Drifted bool `json:"drifted"`
	// Next says what the consumer does with this partition at its next assignment.
	Next        string              `json:"next"`
	ReplayEpoch int                 `json:"replay_epoch"`
	LastEvent   *offsetstore.Event  `json:"last_event"`
	Pending     []offsetstore.Event `json:"pending,omitempty"`
	// Error is set, with Topic and Partition empty, when the group could not be compared
	// (for example a topic it has a watermark on was deleted).
	Error string `json:"error,omitempty"`
}

func rowOf(s offsets.PartitionStatus) PartitionRow {
	r := PartitionRow{Group: s.Group, Topic: s.Topic, Partition: s.Partition, Watermark: -1, Committed: -1,
		LogStart: s.LogStart, LogEnd: s.LogEnd, Lag: s.Lag, Drift: s.Drift, State: string(s.State), Drifted: s.Drifted(),
		ReplayEpoch: s.ReplayEpoch, LastEvent: s.LastEvent, Pending: s.Pending}
	if s.Watermark != nil {
		r.Watermark = *s.Watermark
	}
	if s.Committed != nil {
		r.Committed = *s.Committed
	}
	r.Next = nextStep(r)
	return r
}

// nextStep describes, for a state the offset classifier gave, what the consumer does at its
// next assignment (docs/offsets.md, "What the consumer does on assignment").
func nextStep(r PartitionRow) string {
	var s string
	switch offsetstate.State(r.State) {
	case offsetstate.Aligned:
		s = fmt.Sprintf("resumes at the watermark %d", r.Watermark)
	case offsetstate.KafkaAhead:
		s = fmt.Sprintf("follows Kafka to %d and audits [%d, %d) as a skip (halts instead under OnKafkaAhead: halt)", r.Committed, r.Watermark, r.Committed)
	case offsetstate.KafkaBehind, offsetstate.KafkaMissing:
		s = fmt.Sprintf("starts at the watermark %d and commits it to Kafka", r.Watermark)
	case offsetstate.NoWatermark:
		s = fmt.Sprintf("first run: starts at Kafka's committed offset %d", r.Committed)
	case offsetstate.Unused:
		s = "first run: starts where auto.offset.reset says"
	case offsetstate.WatermarkPastLogEnd:
		s = fmt.Sprintf("refuses to start: the watermark %d is past the log end %d (topic recreated or truncated)", r.Watermark, r.LogEnd)
	case offsetstate.WatermarkBelowLogStart:
		s = fmt.Sprintf("audits [%d, %d) as an unexplained skip (removed by retention) and starts at the log start", r.Watermark, r.LogStart)
	case offsetstate.KafkaPastLogEnd:
		s = fmt.Sprintf("ignores Kafka's committed offset and resumes at the watermark %d", r.Watermark)
	default:
		s = "see `kafkatx offsets status --help`"
	}
	if n := len(r.Pending); n > 0 {
		s += fmt.Sprintf("; %d pending operator command(s) recorded (audit row %d)", n, r.Pending[0].ID)
	}
	return s
}

// groups lists the consumer groups with a watermark, sorted.
func (h *Handler) groups(ctx context.Context) ([]string, error) {
	rows, err := h.cfg.Pool.Query(ctx, `SELECT DISTINCT group_id FROM `+pgx.Identifier{h.cfg.Schema, "watermarks"}.Sanitize()+` ORDER BY 1 LIMIT $1`, maxGroups)
	if err != nil {
		return nil, fmt.Errorf("list consumer groups: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// partitions compares every partition of group (every group with a watermark when group is
// ""), through the offsets status code path.
func (h *Handler) partitions(ctx context.Context, group string) ([]PartitionRow, error) {
	groups := []string{group}
	if group == "" {
		var err error
		if groups, err = h.groups(ctx); err != nil {
			return nil, err
		}
	}
	out := []PartitionRow{}
	for _, g := range groups {
		sts, err := h.op.Status(ctx, g, "")
		if err != nil {
			if ctx.Err() != nil {
				return nil, err
			}
			out = append(out, PartitionRow{Group: g, Watermark: -1, Committed: -1, State: "error", Error: h.redact(err.Error())})
			continue
		}
		for _, s := range sts {
			out = append(out, rowOf(s))
		}
	}
	return out, nil
}

// apiPartitions answers GET /api/partitions[?group=G].
func (h *Handler) apiPartitions(w http.ResponseWriter, r *http.Request) {
	rows, err := h.partitions(r.Context(), r.URL.Query().Get("group"))
	if err != nil {
		h.fail(w, r, http.StatusBadGateway, err.Error())
		return
	}
	h.writeJSON(w, http.StatusOK, rows)
}

// apiOffsetAudit answers GET /api/offsets/audit?group=G[&topic=T]: the offset audit trail,
// oldest first (`kafkatx offsets audit --output json`).
func (h *Handler) apiOffsetAudit(w http.ResponseWriter, r *http.Request) {
	g := r.URL.Query().Get("group")
	if g == "" {
		h.fail(w, r, http.StatusBadRequest, "group is required: /api/offsets/audit?group=G[&topic=T]")
		return
	}
	ev, err := h.op.Events(r.Context(), g, r.URL.Query().Get("topic"))
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	if ev == nil {
		ev = []offsetstore.Event{}
	}
	h.writeJSON(w, http.StatusOK, ev)
}

// partitionsView is the data of the partitions page.
type partitionsView struct {
	Rows    []PartitionRow
	Drifted int
}

// partitionsPage renders GET /: every group's partitions, drift highlighted.
func (h *Handler) partitionsPage(w http.ResponseWriter, r *http.Request) {
	rows, err := h.partitions(r.Context(), "")
	p := h.page(r, "partitions", "Partitions", nil)
	if err != nil {
		p.Error = err.Error()
	}
	v := partitionsView{Rows: rows}
	for _, row := range rows {
		if row.Drifted {
			v.Drifted++
		}
	}
	p.Data = v
	h.render(w, r, http.StatusOK, "partitions", p)
}
