package console

import (
	"context"
	"fmt"
	"html/template"
	"net/http"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/offsets"
	"github.com/kafkatx/kafkatx/internal/offsetstate"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/internal/tables"
)

// maxGroups bounds the consumer groups the partitions view compares (one Kafka round trip each).
const maxGroups = 200

// PartitionRow is one partition of one consumer group in GET /api/partitions: the fields of
// `kafkatx offsets status --output json`, with the offsets as numbers (-1 when none) and
// what the consumer will do at its next assignment.
type PartitionRow struct {
	// Shard names the shard holding the partition's state when the console reads a sharded
	// service (Config.Shards): the shard the directory maps it to; absent otherwise.
	Shard     string `json:"shard,omitempty"`
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
	// TopicID is the topic id (KIP-516) of the log the watermark counts offsets in (the one
	// the broker describes when none is recorded yet); "" when unknown.
	TopicID string `json:"topic_id,omitempty"`
	// LogChange says what changed when State is log_changed (the old and new topic or
	// cluster ids); empty otherwise.
	LogChange string `json:"log_change,omitempty"`
	// Attention lists the audit rows of the last 7 days (AttentionWindow) an operator must
	// not miss (an unexplained skip, a watermark moved outside kafkatx, ...), by kind.
	Attention []Attention `json:"attention,omitempty"`
	// NeedsAttention is true when Attention is not empty or the partition drifted.
	NeedsAttention bool `json:"needs_attention"`
	// Chart is the lag and throughput of the last hour, for the pages (not in the API:
	// GET /api/partitions/history has the samples).
	Chart template.HTML `json:"-"`
	// Error is set, with Topic and Partition empty, when the group could not be compared
	// (for example a topic it has a watermark on was deleted).
	Error string `json:"error,omitempty"`
	// StaleCopies lists the partition's watermark rows on shards the directory does not map
	// it to (offsets status --shard's stale_copies): it needs attention.
	StaleCopies []offsets.StaleCopy `json:"stale_copies,omitempty"`
	// Parked is the partition's parked keys and messages (Config.Park); null when none.
	Parked *ParkedTotals `json:"parked,omitempty"`
	// BlockedByKey is set when the partition waits on a parked key (parked.go,
	// blockedByKey): it needs attention.
	BlockedByKey *BlockedByKey `json:"blocked_by_key,omitempty"`

	status offsets.PartitionStatus // what the row was made from
}

func rowOf(s offsets.PartitionStatus) PartitionRow {
	r := PartitionRow{Shard: s.Shard, StaleCopies: s.StaleCopies, Group: s.Group, Topic: s.Topic, Partition: s.Partition, Watermark: -1, Committed: -1,
		LogStart: s.LogStart, LogEnd: s.LogEnd, Lag: s.Lag, Drift: s.Drift, State: string(s.State), Drifted: s.Drifted(),
		ReplayEpoch: s.ReplayEpoch, LastEvent: s.LastEvent, Pending: s.Pending, status: s}
	if s.Watermark != nil {
		r.Watermark = *s.Watermark
	}
	if s.Committed != nil {
		r.Committed = *s.Committed
	}
	if s.Log != nil {
		r.TopicID = s.Log.RecordedTopicID
		if r.TopicID == "" {
			r.TopicID = s.Log.TopicID
		}
	}
	if s.State == offsetstate.LogChanged {
		r.LogChange = s.Log.Change().What()
	}
	r.Next = nextStep(r)
	return r
}

// nextStep says what the consumer does with the partition at its next assignment: the
// offset classifier's decision (offsetstate.Classify, which the consumer runs on every
// assignment) for these offsets under the default policy (OnKafkaAhead follow,
// auto.offset.reset earliest), in words.
func nextStep(r PartitionRow) string {
	if r.State == "error" {
		return ""
	}
	if r.State == string(offsetstate.LogChanged) {
		return fmt.Sprintf("processes nothing: the log behind the watermark changed (%s); an operator adopts the new log (offsets reset --mode adopt)", r.LogChange)
	}
	d := offsetstate.Classify(offsetstate.Offsets{W: r.Watermark, HasW: r.Watermark >= 0, K: r.Committed, HasK: r.Committed >= 0,
		LogStart: r.LogStart, LogEnd: r.LogEnd, KMarkedHere: r.State == string(offsetstate.DatabaseRolledBack)}, offsetstate.Policy{})
	if d.State == offsetstate.WatermarkPastLogEnd {
		return fmt.Sprintf("processes nothing: the watermark %d is past the log end %d (topic recreated or truncated); an operator decides (offsets reset)", r.Watermark, r.LogEnd)
	}
	var steps []string
	if d.IgnoreK {
		steps = append(steps, fmt.Sprintf("ignores Kafka's committed offset %d (past the log end)", r.Committed))
	}
	if d.RetentionFrom >= 0 {
		steps = append(steps, fmt.Sprintf("audits [%d, %d) as an unexplained skip (removed by retention)", d.RetentionFrom, r.LogStart))
	}
	commit := ""
	if d.Commit {
		commit = " and commits it to Kafka"
	}
	switch d.Compared {
	case offsetstate.Aligned:
		steps = append(steps, fmt.Sprintf("resumes at %d", d.Start))
	case offsetstate.KafkaAhead:
		steps = append(steps, fmt.Sprintf("follows Kafka: audits [%d, %d) as a skip and starts at %d (halts instead under OnKafkaAhead: halt)", d.W, d.Start, d.Start))
	case offsetstate.DatabaseRolledBack:
		steps = append(steps, fmt.Sprintf("re-processes [%d, %d): the database lost them (Kafka's offset %d was committed by kafkatx on this database); audits rollback_replayed and starts at the watermark %d%s",
			d.W, r.Committed, r.Committed, d.Start, commit))
	case offsetstate.KafkaBehind, offsetstate.KafkaMissing:
		steps = append(steps, fmt.Sprintf("starts at the watermark %d%s", d.Start, commit))
	case offsetstate.NoWatermark:
		steps = append(steps, fmt.Sprintf("first run: starts at Kafka's committed offset %d", d.Start))
	case offsetstate.Unused:
		steps = append(steps, fmt.Sprintf("first run: starts at the log start %d%s (at the log end %d under auto.offset.reset latest)", d.Start, commit, r.LogEnd))
	}
	s := strings.Join(steps, ", then ")
	if n := len(r.Pending); n > 0 {
		s += fmt.Sprintf("; %d pending operator command(s) recorded (audit row %d)", n, r.Pending[0].ID)
	}
	return s
}

// groups lists the consumer groups with a watermark (on any shard with Config.Shards), sorted.
func (h *Handler) groups(ctx context.Context) ([]string, error) {
	pools := []*pgxpool.Pool{h.cfg.Pool}
	if h.cfg.Shards != nil {
		pools = pools[:0]
		for _, sh := range h.cfg.Shards.Shards {
			pools = append(pools, sh.Pool)
		}
	}
	seen := map[string]bool{}
	var out []string
	for _, pool := range pools {
		rows, err := pool.Query(ctx, `SELECT DISTINCT group_id FROM `+tables.For(h.cfg.Schema).Watermarks+` ORDER BY 1 LIMIT $1`, maxGroups)
		if err != nil {
			return nil, fmt.Errorf("list consumer groups: %w", err)
		}
		gs, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, fmt.Errorf("list consumer groups: %w", err)
		}
		for _, g := range gs {
			if !seen[g] {
				seen[g] = true
				out = append(out, g)
			}
		}
	}
	slices.Sort(out)
	if len(out) > maxGroups {
		out = out[:maxGroups]
	}
	return out, nil
}

// status is offsets status of group: over every shard with Config.Shards.
func (h *Handler) status(ctx context.Context, group string) ([]offsets.PartitionStatus, error) {
	if h.cfg.Shards != nil {
		return offsets.ShardedStatus(ctx, h.cfg.Shards, h.cfg.Schema, h.shardOps, group, "")
	}
	return h.op.Status(ctx, group, "")
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
	defer func() {
		if len(out) == 0 {
			return
		}
		h.addParked(ctx, groups, out)
		att, err := h.attentionOf(ctx, groups)
		if err != nil {
			h.log.Warn("console: " + err.Error())
			return
		}
		for i := range out {
			r := &out[i]
			r.Attention = att[tpKey{r.Group, r.Topic, r.Partition}]
			r.NeedsAttention = r.Drifted || len(r.Attention) > 0 || r.Error != "" || r.State == string(offsetstate.LogChanged) || r.State == string(offsetstate.DatabaseRolledBack) ||
				r.BlockedByKey != nil || len(r.StaleCopies) > 0
		}
	}()
	for _, g := range groups {
		sts, err := h.status(ctx, g)
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

// addCharts draws each row's lag chart from the samples of the last hour.
func (h *Handler) addCharts(ctx context.Context, group string, rows []PartitionRow, w, hgt int, labels bool) {
	hist, err := h.history(ctx, group, chartWindow)
	if err != nil {
		h.log.Warn("console: " + h.redact(err.Error()))
		return
	}
	for i := range rows {
		if rows[i].Error == "" {
			rows[i].Chart = chartSVG(hist[tpKey{rows[i].Group, rows[i].Topic, rows[i].Partition}], w, hgt, labels)
		}
	}
}

// partitionsView is the data of the partitions page.
type partitionsView struct {
	// Sharded shows the shard column (Config.Shards).
	Sharded bool
	Rows    []PartitionRow
	Drifted int
	// Attention counts the partitions that need attention, and Kinds the audit rows behind
	// it by kind (unexplained_skip: 2, ...).
	Attention int
	Kinds     []kindCount
}

type kindCount struct {
	Kind  string
	Count int
}

// partitionsPage renders GET /: every group's partitions, drift highlighted.
func (h *Handler) partitionsPage(w http.ResponseWriter, r *http.Request) {
	rows, err := h.partitions(r.Context(), "")
	p := h.page(r, "partitions", "Partitions", nil)
	if err != nil {
		p.Error = err.Error()
	}
	h.addCharts(r.Context(), "", rows, 160, 34, false)
	v := partitionsView{Rows: rows, Sharded: h.cfg.Shards != nil}
	byKind := map[string]int{}
	for _, row := range rows {
		if row.Drifted {
			v.Drifted++
		}
		if row.NeedsAttention {
			v.Attention++
		}
		if row.BlockedByKey != nil {
			if byKind[blockedKind] == 0 {
				v.Kinds = append(v.Kinds, kindCount{Kind: blockedKind})
			}
			byKind[blockedKind]++
		}
		for _, a := range row.Attention {
			k := a.Kind
			if a.Status == offsetstore.StatusAbandoned {
				k += " (abandoned)"
			}
			if byKind[k] == 0 {
				v.Kinds = append(v.Kinds, kindCount{Kind: k})
			}
			byKind[k] += a.Count
		}
	}
	for i := range v.Kinds {
		v.Kinds[i].Count = byKind[v.Kinds[i].Kind]
	}
	p.Data = v
	h.render(w, r, http.StatusOK, "partitions", p)
}
