package console

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/tables"
)

// maxParkedShown bounds the parked rows listed.
const maxParkedShown = 500

// BacklogRow counts the outbox records of one topic in one state (pending, parked, or packed:
// in packed rows, counted under each pack's first record's topic). Rows counts records.
type BacklogRow struct {
	Topic  string    `json:"topic"`
	State  string    `json:"state"`
	Rows   int64     `json:"rows"`
	Oldest time.Time `json:"oldest"`
	// AgeSeconds is how long the oldest row has waited, in seconds.
	AgeSeconds float64 `json:"age_seconds"`
}

// ParkedItem is a parked outbox row (key and value summarized).
type ParkedItem struct {
	ID        int64     `json:"id"`
	OutboxID  string    `json:"outbox_id"`
	Topic     string    `json:"topic"`
	Partition *int32    `json:"partition,omitempty"`
	Key       string    `json:"key"`
	Value     string    `json:"value"`
	Attempts  int       `json:"attempts"`
	Error     string    `json:"error"`
	CreatedAt time.Time `json:"created_at"`
	ParkedAt  time.Time `json:"parked_at"`
	Waiting   int64     `json:"waiting_behind"`
}

// RelayLeader is the database session holding the relay's leadership lock (the advisory lock
// on hashtextextended('kafkatx.relay.' || schema, 0)); nil when no relay leads.
type RelayLeader struct {
	PID             int32      `json:"pid"`
	ApplicationName string     `json:"application_name"`
	ClientAddr      string     `json:"client_addr"`
	BackendStart    time.Time  `json:"backend_start"`
	StateChange     *time.Time `json:"state_change,omitempty"`
}

// SlotHealth is a logical replication slot of this database (WAL-mode outbox), from
// pg_replication_slots.
type SlotHealth struct {
	Name      string `json:"name"`
	Plugin    string `json:"plugin"`
	Active    bool   `json:"active"`
	WALStatus string `json:"wal_status"`
	// LagBytes is the WAL the slot holds back: the current LSN minus its confirmed flush LSN.
	LagBytes          int64  `json:"lag_bytes"`
	ConfirmedFlushLSN string `json:"confirmed_flush_lsn"`
}

// OutboxView is GET /api/outbox.
type OutboxView struct {
	Backlog []BacklogRow  `json:"backlog"`
	Parked  []ParkedItem  `json:"parked"`
	Leader  *RelayLeader  `json:"relay_leader"`
	Slots   []SlotHealth  `json:"slots"`
	Audit   []OutboxAudit `json:"audit"`
}

// OutboxAudit is one outbox_audit row (release or discard of a parked row).
type OutboxAudit struct {
	ID        int64     `json:"id"`
	OutboxRow int64     `json:"outbox_row"`
	Action    string    `json:"action"`
	Reason    string    `json:"reason"`
	Actor     string    `json:"actor"`
	At        time.Time `json:"at"`
}

func (h *Handler) outboxView(ctx context.Context) (*OutboxView, error) {
	t := tables.For(h.cfg.Schema)
	v := &OutboxView{Backlog: []BacklogRow{}, Parked: []ParkedItem{}, Slots: []SlotHealth{}, Audit: []OutboxAudit{}}
	// Records, not rows: a packed row (state 'packed', migration 015) counts the records it
	// holds, under its first record's topic (a pack may hold records of other topics too).
	rows, err := h.cfg.Pool.Query(ctx, `SELECT topic, state, sum(pack_count)::bigint, min(created_at), extract(epoch FROM now() - min(created_at))::float8
		FROM `+t.Outbox+` WHERE state IN ('pending', 'parked', 'packed') GROUP BY topic, state ORDER BY topic, state`)
	if err != nil {
		return nil, fmt.Errorf("outbox backlog: %w", err)
	}
	if v.Backlog, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (BacklogRow, error) {
		var b BacklogRow
		return b, r.Scan(&b.Topic, &b.State, &b.Rows, &b.Oldest, &b.AgeSeconds)
	}); err != nil {
		return nil, fmt.Errorf("outbox backlog: %w", err)
	}
	// outbox.Writer.Parked's rows, with only a prefix of each key and value read: parked rows
	// are often the large ones.
	rows, err = h.cfg.Pool.Query(ctx, `SELECT o.id, o.outbox_id::text, o.topic, o.partition, substring(o.key from 1 for $2),
			coalesce(octet_length(o.key), 0), sha256(o.key), substring(o.value from 1 for $2), coalesce(octet_length(o.value), 0), sha256(o.value),
			o.attempts, coalesce(o.last_error, ''), o.created_at, coalesce(o.parked_at, o.created_at),
			(SELECT count(*) FROM `+t.Outbox+` b WHERE b.state = 'pending' AND b.topic = o.topic AND b.key = o.key)
		FROM `+t.Outbox+` o WHERE o.state = 'parked' ORDER BY o.id LIMIT $1`, maxParkedShown, summaryPrefix)
	if err != nil {
		return nil, fmt.Errorf("parked outbox rows: %w", err)
	}
	if v.Parked, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (ParkedItem, error) {
		var p ParkedItem
		var key, value, keySum, valueSum []byte
		var keySize, valueSize int
		err := r.Scan(&p.ID, &p.OutboxID, &p.Topic, &p.Partition, &key, &keySize, &keySum, &value, &valueSize, &valueSum,
			&p.Attempts, &p.Error, &p.CreatedAt, &p.ParkedAt, &p.Waiting)
		p.Key, p.Value = summaryOf(h.mask.Bytes(key, len(key) < keySize), keySize, keySum), summaryOf(h.mask.Bytes(value, len(value) < valueSize), valueSize, valueSum)
		p.Error = h.mask.String(p.Error)
		return p, err
	}); err != nil {
		return nil, fmt.Errorf("parked outbox rows: %w", err)
	}
	var l RelayLeader
	var addr *string
	err = h.cfg.Pool.QueryRow(ctx, `SELECT a.pid, coalesce(a.application_name, ''), host(a.client_addr), a.backend_start, a.state_change
		FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND ((l.classid::bigint << 32) | l.objid::bigint) = hashtextextended('kafkatx.relay.' || $1, 0)
		LIMIT 1`, h.cfg.Schema).Scan(&l.PID, &l.ApplicationName, &addr, &l.BackendStart, &l.StateChange)
	switch {
	case err == pgx.ErrNoRows:
	case err != nil:
		return nil, fmt.Errorf("relay leader: %w", err)
	default:
		if addr != nil {
			l.ClientAddr = *addr
		} else {
			l.ClientAddr = "local socket"
		}
		v.Leader = &l
	}
	rows, err = h.cfg.Pool.Query(ctx, `SELECT slot_name::text, coalesce(plugin::text, ''), active, coalesce(wal_status, ''),
			coalesce(CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn) END, 0)::bigint,
			coalesce(confirmed_flush_lsn::text, '')
		FROM pg_replication_slots WHERE slot_type = 'logical' AND database = current_database() ORDER BY slot_name`)
	if err != nil {
		return nil, fmt.Errorf("replication slots: %w", err)
	}
	if v.Slots, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (SlotHealth, error) {
		var s SlotHealth
		return s, r.Scan(&s.Name, &s.Plugin, &s.Active, &s.WALStatus, &s.LagBytes, &s.ConfirmedFlushLSN)
	}); err != nil {
		return nil, fmt.Errorf("replication slots: %w", err)
	}
	rows, err = h.cfg.Pool.Query(ctx, `SELECT id, outbox_row, action, reason, actor, at FROM `+t.OutboxAudit+`
		ORDER BY id DESC LIMIT 50`)
	if err != nil {
		return nil, fmt.Errorf("outbox audit: %w", err)
	}
	if v.Audit, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (OutboxAudit, error) {
		var a OutboxAudit
		return a, r.Scan(&a.ID, &a.OutboxRow, &a.Action, &a.Reason, &a.Actor, &a.At)
	}); err != nil {
		return nil, fmt.Errorf("outbox audit: %w", err)
	}
	return v, nil
}

// apiOutbox answers GET /api/outbox.
func (h *Handler) apiOutbox(w http.ResponseWriter, r *http.Request) {
	v, err := h.outboxView(r.Context())
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	h.writeJSON(w, http.StatusOK, v)
}

// apiOutboxAction answers POST /api/outbox/{id}/release|discard with a JSON body
// ActionParams: 200 and the ActionResult, 404 when the row is not parked.
func (h *Handler) apiOutboxAction(w http.ResponseWriter, r *http.Request) {
	action, id, p, ok := h.oneItemAction(w, r, "an outbox row", actRelease, actDiscard)
	if !ok {
		return
	}
	res := h.outboxAction(r.Context(), action, []int64{id}, p, h.actor(r))
	status := http.StatusOK
	if it := res.Items[0]; !it.OK {
		status = http.StatusInternalServerError
		if it.NotFound {
			status = http.StatusNotFound
		}
	}
	h.writeJSON(w, status, res)
}

// outboxPage renders GET /outbox.
func (h *Handler) outboxPage(w http.ResponseWriter, r *http.Request) {
	p := h.page(r, "outbox", "Outbox", nil)
	v, err := h.outboxView(r.Context())
	if err != nil {
		p.Error = err.Error()
		v = &OutboxView{}
	}
	p.Data = v
	h.render(w, r, http.StatusOK, "outbox", p)
}

// outboxActionForm handles POST /outbox/action: action (release or discard), reason,
// dry_run and the ids of the parked rows.
func (h *Handler) outboxActionForm(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		h.fail(w, r, http.StatusBadRequest, "bad form: "+err.Error())
		return
	}
	action := r.PostFormValue("action")
	if action != actRelease && action != actDiscard {
		h.fail(w, r, http.StatusBadRequest, fmt.Sprintf("no action %q on outbox rows: release or discard", action))
		return
	}
	var ids []int64
	for _, s := range r.PostForm["id"] {
		id, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			h.fail(w, r, http.StatusBadRequest, fmt.Sprintf("id %q: want a number", s))
			return
		}
		ids = append(ids, id)
	}
	p := ActionParams{Reason: r.PostFormValue("reason"), DryRun: r.PostFormValue("dry_run") != ""}
	if err := checkParams(p, ids); err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	res := h.outboxAction(r.Context(), action, ids, p, h.actor(r))
	h.render(w, r, http.StatusOK, "result", h.page(r, "outbox", "Outbox: "+action,
		resultView{On: "outbox", Result: res, IDs: ids, Confirm: res.DryRun && res.Done > 0, Back: h.cfg.BasePath + "/outbox"}))
}
