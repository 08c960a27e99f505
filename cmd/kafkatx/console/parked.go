package console

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/kafkatx/kafkatx/internal/offsets"
	"github.com/kafkatx/kafkatx/internal/parking"
)

// This file is the console's read-only view of parked keys (Config.Park; table key_parking,
// package internal/parking): a consumer group's input messages of a key in trouble, set
// aside while the partition's other keys go on — not the outbox's parked rows. Releasing or
// dead-lettering a key stays in the CLI (`kafkatx parked-keys release|dead-letter`), which
// audits it in offset_audit.

// maxParkedKeysShown bounds the keys GET /parked-keys and GET /api/parked-keys list.
const maxParkedKeysShown = 1000

// BlockedAfter is how long a partition with parked keys and lag may hold its watermark still
// before the console shows it blocked by a key: `kafkatx offsets status --stalled-after`'s
// default.
const BlockedAfter = 2 * time.Minute

// ParkedKeyItem is one parked key as GET /api/parked-keys gives it.
type ParkedKeyItem struct {
	Group     string `json:"group"`
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	// Key is a summary of the key (size, SHA-256 prefix, escaped prefix; "null" for a nil
	// key), masked like every answer; KeyHash the key's identity (`--key-hash` of the CLI).
	Key        string    `json:"key"`
	KeyHash    string    `json:"key_hash"`
	HeadOffset int64     `json:"head_offset"`
	Count      int       `json:"count"`
	ParkedAt   time.Time `json:"parked_at"`
	AgeSeconds float64   `json:"age_seconds"`
	Attempts   int       `json:"attempts"`
	ErrorClass string    `json:"error_class,omitempty"`
	LastError  string    `json:"last_error,omitempty"`
	// NextTry is the head's next try; null when it is due now.
	NextTry *time.Time `json:"next_try"`
}

// ParkedTotals is one partition's parked keys and messages (PartitionRow.Parked).
type ParkedTotals struct {
	Keys     int       `json:"keys"`
	Messages int       `json:"messages"`
	Oldest   time.Time `json:"oldest"`
}

// BlockedByKey says that a partition is blocked by a parked key (PartitionRow.BlockedByKey).
type BlockedByKey struct {
	Key     string `json:"key"`      // summary, as ParkedKeyItem.Key
	KeyHash string `json:"key_hash"` // as ParkedKeyItem.KeyHash
	Offset  int64  `json:"offset"`   // the watermark the partition waits at
	Count   int    `json:"count"`    // the key's parked messages
	Why     string `json:"why"`
}

// BlockingKey is the one rule of the "blocked by key K at offset X" state that the console
// and `kafkatx parked-keys list` show: a partition with parked keys (keys, its parked keys as
// parking.Store.Keys lists them) whose watermark X has not moved for BlockedAfter while it has
// lag (offsets.PartitionStatus.Stalled) waits on a key — the consumer logs the exact one
// ("blocked by key K at offset X": a key at Config.Park.MaxPerKey, or Config.Park.MaxKeys
// reached). Both read the database, not the consumer's memory, so they name the parked key
// with the most parked messages (the one a per-key bound holds; the earliest head on a tie).
// ok is false when the partition is not blocked; X is *s.Watermark.
func BlockingKey(s offsets.PartitionStatus, keys []parking.Key, now time.Time) (k parking.Key, ok bool) {
	if len(keys) == 0 || s.Watermark == nil || !s.Stalled(BlockedAfter, now) {
		return k, false
	}
	k = keys[0]
	for _, c := range keys[1:] {
		if c.Count > k.Count || c.Count == k.Count && c.HeadOffset < k.HeadOffset {
			k = c
		}
	}
	return k, true
}

// blockedByKey is BlockingKey for a row of the console (p its parked totals); nil when not
// blocked.
func (h *Handler) blockedByKey(s offsets.PartitionStatus, p *ParkedTotals, keys []parking.Key, now time.Time) *BlockedByKey {
	top, ok := BlockingKey(s, keys, now)
	if p == nil || !ok {
		return nil
	}
	b := &BlockedByKey{Key: h.keySummary(top.Key), KeyHash: hex.EncodeToString(top.KeyHash), Offset: *s.Watermark, Count: top.Count}
	b.Why = fmt.Sprintf("blocked by key %s at offset %d: the watermark has not moved for %v with lag %d and %d parked key(s); the key has %d parked message(s) (the consumer's log names the key it waits on)",
		b.Key, b.Offset, BlockedAfter, s.Lag, p.Keys, top.Count)
	return b
}

// blockedKind names the "blocked by key" state in the partitions page's attention summary.
const blockedKind = "blocked_by_key"

// addParked sets each row's Parked and BlockedByKey. A schema without the parked keys' table
// (before migration 013) or an error leaves them unset, logged.
func (h *Handler) addParked(ctx context.Context, groups []string, rows []PartitionRow) {
	totals, err := h.parkedTotals(ctx, groups)
	if err != nil {
		h.log.Warn("console: " + h.redact(err.Error()))
		return
	}
	now := time.Now()
	for i := range rows {
		r := &rows[i]
		if r.Error != "" {
			continue
		}
		r.Parked = totals[tpKey{r.Group, r.Topic, r.Partition}]
		if r.Parked == nil || !r.status.Stalled(BlockedAfter, now) {
			continue
		}
		keys, err := parking.New(h.cfg.Schema).Keys(ctx, h.cfg.Pool, r.Group, r.Topic, r.Partition, 0)
		if err != nil {
			h.log.Warn("console: " + h.redact(err.Error()))
			continue
		}
		r.BlockedByKey = h.blockedByKey(r.status, r.Parked, keys, now)
	}
}

// keySummary is a key as the console shows it: summaryOf over the masked key.
func (h *Handler) keySummary(key []byte) string {
	if key == nil {
		return "null"
	}
	sum := sha256.Sum256(key)
	prefix := key[:min(len(key), summaryPrefix+1)]
	return summaryOf(h.mask.Bytes(prefix, len(prefix) < len(key)), len(key), sum[:])
}

// parkedTotals reads the parked totals of groups' partitions.
func (h *Handler) parkedTotals(ctx context.Context, groups []string) (map[tpKey]*ParkedTotals, error) {
	st := parking.New(h.cfg.Schema)
	out := map[tpKey]*ParkedTotals{}
	for _, g := range groups {
		ps, err := st.Totals(ctx, h.cfg.Pool, g, "")
		if err != nil {
			return nil, err
		}
		for _, p := range ps {
			out[tpKey{p.Group, p.Topic, p.Partition}] = &ParkedTotals{Keys: p.Keys, Messages: p.Messages, Oldest: p.Oldest}
		}
	}
	return out, nil
}

// parkedQuery is the selection of GET /parked-keys and /api/parked-keys.
type parkedQuery struct {
	Group, Topic string
	Partition    int32 // -1: every partition
}

func parseParkedQuery(r *http.Request) (parkedQuery, error) {
	q := parkedQuery{Group: r.URL.Query().Get("group"), Topic: r.URL.Query().Get("topic"), Partition: -1}
	if v := r.URL.Query().Get("partition"); v != "" {
		p, err := strconv.ParseInt(v, 10, 32)
		if err != nil || p < 0 {
			return q, fmt.Errorf("partition %q: want a partition, 0 or more", v)
		}
		if q.Topic == "" {
			return q, fmt.Errorf("partition needs topic: /parked-keys?group=G&topic=T&partition=P")
		}
		q.Partition = int32(p)
	}
	return q, nil
}

// parkedKeys lists the parked keys q selects (every group with a watermark when q.Group is
// ""), at most maxParkedKeysShown; more is true when there were more.
func (h *Handler) parkedKeys(ctx context.Context, q parkedQuery) (items []ParkedKeyItem, more bool, err error) {
	groups := []string{q.Group}
	if q.Group == "" {
		if groups, err = h.groups(ctx); err != nil {
			return nil, false, err
		}
	}
	st, now := parking.New(h.cfg.Schema), time.Now()
	items = []ParkedKeyItem{}
	for _, g := range groups {
		ps, err := st.Totals(ctx, h.cfg.Pool, g, q.Topic)
		if err != nil {
			return nil, false, err
		}
		var topics []string
		for _, p := range ps {
			if len(topics) == 0 || topics[len(topics)-1] != p.Topic {
				topics = append(topics, p.Topic)
			}
		}
		for _, t := range topics {
			ks, err := st.Keys(ctx, h.cfg.Pool, g, t, q.Partition, maxParkedKeysShown+1-len(items))
			if err != nil {
				return nil, false, err
			}
			for _, k := range ks {
				it := ParkedKeyItem{Group: k.Group, Topic: k.Topic, Partition: k.Partition, Key: h.keySummary(k.Key), KeyHash: hex.EncodeToString(k.KeyHash),
					HeadOffset: k.HeadOffset, Count: k.Count, ParkedAt: k.ParkedAt, AgeSeconds: max(now.Sub(k.ParkedAt).Seconds(), 0),
					Attempts: k.Attempts, ErrorClass: k.ErrorClass, LastError: k.LastError}
				if !k.NextTry.IsZero() && k.NextTry.After(now) {
					t := k.NextTry
					it.NextTry = &t
				}
				items = append(items, it)
			}
			if len(items) > maxParkedKeysShown {
				return items[:maxParkedKeysShown], true, nil
			}
		}
	}
	return items, false, nil
}

// parkedKeysAnswer is GET /api/parked-keys' answer.
type parkedKeysAnswer struct {
	Keys []ParkedKeyItem `json:"keys"`
	// Truncated is true when more than maxParkedKeysShown (1,000) keys are parked.
	Truncated bool `json:"truncated"`
}

// apiParkedKeys answers GET /api/parked-keys[?group=G[&topic=T[&partition=P]]].
func (h *Handler) apiParkedKeys(w http.ResponseWriter, r *http.Request) {
	q, err := parseParkedQuery(r)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	items, more, err := h.parkedKeys(r.Context(), q)
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	h.writeJSON(w, http.StatusOK, parkedKeysAnswer{Keys: items, Truncated: more})
}

// parkedView is the data of the parked keys page.
type parkedView struct {
	Query     parkedQuery
	Keys      []ParkedKeyItem
	Truncated bool
	// Partitions are the partitions with parked keys, blocked ones first.
	Partitions []PartitionRow
}

// parkedKeysPage renders GET /parked-keys[?group=G[&topic=T[&partition=P]]].
func (h *Handler) parkedKeysPage(w http.ResponseWriter, r *http.Request) {
	q, err := parseParkedQuery(r)
	p := h.page(r, "parked-keys", "Parked keys", nil)
	if err != nil {
		p.Error = err.Error()
		h.render(w, r, http.StatusBadRequest, "parked-keys", p)
		return
	}
	v := parkedView{Query: q}
	if v.Keys, v.Truncated, err = h.parkedKeys(r.Context(), q); err != nil {
		p.Error = err.Error()
	}
	rows, err := h.partitions(r.Context(), q.Group)
	if err != nil && p.Error == "" {
		p.Error = err.Error()
	}
	for _, row := range rows {
		if row.Parked != nil && (q.Topic == "" || row.Topic == q.Topic) && (q.Partition < 0 || row.Partition == q.Partition) {
			v.Partitions = append(v.Partitions, row)
		}
	}
	sort.SliceStable(v.Partitions, func(i, j int) bool { return v.Partitions[i].BlockedByKey != nil && v.Partitions[j].BlockedByKey == nil })
	p.Data = v
	h.render(w, r, http.StatusOK, "parked-keys", p)
}
