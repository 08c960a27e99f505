package walrelay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/msgfmt"
	"github.com/kafkatx/kafkatx/internal/offsetstate"
	"github.com/kafkatx/kafkatx/outbox"
)

// Health is the slot's state as the relay last read it (pg_replication_slots).
type Health struct {
	Slot string
	// Missing: the slot does not exist (dropped, or never created).
	Missing bool
	// WALStatus is pg_replication_slots.wal_status: reserved, extended, unreserved or lost.
	WALStatus string
	// RetainedBytes is the WAL the slot keeps (current position - restart_lsn).
	RetainedBytes int64
	// LagBytes is the WAL not yet confirmed (current position - confirmed_flush_lsn).
	LagBytes int64
	// SafeBytes is how much more WAL may be written before the slot is invalidated by
	// max_slot_wal_keep_size (pg_replication_slots.safe_wal_size); -1 when unlimited.
	SafeBytes int64
	At        time.Time
	// Stopped is the FatalError that stopped the relay (empty while it has not): the slot
	// cannot be streamed by it — its WAL removed on this server (58P01, whatever wal_status
	// reads), the slot lost at start, or the server lacking what WAL mode needs.
	Stopped string
}

// Ready reports whether the relay can stream the slot: it exists, its WAL is not lost, and no
// FatalError stopped the relay. A slot reading wal_status unreserved (past
// max_slot_wal_keep_size, its WAL removed only at the next checkpoint) still streams: ready,
// with the warning of watchSlot.
func (h Health) Ready() bool {
	return h.NotReady() == ""
}

// NotReady is why the relay cannot stream the slot, one line for a readiness probe's body, or
// "" when it can (Ready).
func (h Health) NotReady() string {
	switch {
	case h.Stopped != "":
		return h.Stopped
	case h.Missing:
		return fmt.Sprintf("replication slot %s does not exist", h.Slot)
	case h.WALStatus == "lost":
		return fmt.Sprintf("replication slot %s was invalidated (wal_status lost)", h.Slot)
	case h.At.IsZero():
		return "the replication slot has not been read yet (the relay is starting)"
	}
	return ""
}

// NotReady is why the relay neither streams its slot nor stands by while another relay
// streams it (Stats.Standby), or why the slot cannot be streamed (Health.NotReady): one line
// for a readiness probe, "" when ready on both counts. kafkatx relay's /readyz and the
// examples' in-process relay both ask it.
func (r *Relay) NotReady() string {
	if why := r.Health().NotReady(); why != "" {
		return why
	}
	if s := r.Stats(); !s.Streaming && !s.Standby {
		return "not streaming the replication slot yet (the stream is being opened)"
	}
	return ""
}

// fatal is the loud error for a slot of schema's outbox that is missing or lost, with the
// steps that recover it (outbox.RecoverSlotSteps).
func (h Health) fatal(slot, schema string) error {
	switch {
	case h.Missing:
		return &FatalError{fmt.Errorf("walrelay: replication slot %s does not exist: the events written since the last published checkpoint and not yet relayed are lost "+
			"(writers refuse to emit without it, so no new ones are). Recover: find what was lost from the services' own tables, "+
			"recreate the slot (%s), republish what is missing (docs/outbox-wal.md, Recovery)", slot, outbox.RecoverSlotSteps(schema, false))}
	case h.WALStatus == "lost":
		return &FatalError{fmt.Errorf("walrelay: replication slot %s was invalidated (wal_status lost: it retained more than max_slot_wal_keep_size): "+
			"the events of transactions committed after its confirmed position are lost. Recover: %s, "+
			"then republish what is missing from the services' own tables (docs/outbox-wal.md, Recovery); "+
			"raise max_slot_wal_keep_size or keep the relay running", slot, outbox.RecoverSlotSteps(schema, true))}
	}
	return nil
}

// Health returns the slot's state as last read (every StatusInterval while running).
func (r *Relay) Health() Health {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := r.health
	if p := r.stopped.Load(); p != nil {
		h.Stopped = *p
	}
	return h
}

func (r *Relay) readSlot(ctx context.Context, slot string) (Health, error) {
	h := Health{Slot: slot, At: time.Now()}
	var status *string
	var safe *int64
	err := r.pool.QueryRow(ctx, `SELECT wal_status,
			coalesce((pg_current_wal_lsn() - restart_lsn)::bigint, 0),
			coalesce((pg_current_wal_lsn() - confirmed_flush_lsn)::bigint, 0),
			safe_wal_size
		FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&status, &h.RetainedBytes, &h.LagBytes, &safe)
	if errors.Is(err, pgx.ErrNoRows) {
		h.Missing = true
	} else if err != nil {
		return h, fmt.Errorf("walrelay: read slot %s: %w", slot, err)
	}
	if status != nil {
		h.WALStatus = *status
	}
	h.SafeBytes = -1
	if safe != nil {
		h.SafeBytes = *safe
	}
	r.mu.Lock()
	r.health = h
	r.mu.Unlock()
	return h, nil
}

// watchSlot reads the slot every StatusInterval: metrics, a warning once the retained WAL
// passes WarnRetainedFraction of max_slot_wal_keep_size, and a FatalError when it is missing
// or lost.
func (r *Relay) watchSlot(ctx context.Context, slot string) error {
	t := time.NewTicker(r.cfg.StatusInterval)
	defer t.Stop()
	warned := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		h, err := r.readSlot(ctx, slot)
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("slot check", zap.Error(err))
			}
			continue
		}
		if err := h.fatal(slot, r.cfg.Schema); err != nil {
			return err
		}
		if h.SafeBytes >= 0 {
			limit := h.RetainedBytes + h.SafeBytes
			over := limit > 0 && float64(h.RetainedBytes) >= r.cfg.WarnRetainedFraction*float64(limit)
			if over && !warned {
				r.log.Warn("the slot retains WAL close to max_slot_wal_keep_size: past it PostgreSQL invalidates the slot and the events it holds are lost",
					zap.String("slot", slot), zap.Int64("retained_bytes", h.RetainedBytes), zap.Int64("safe_wal_size_bytes", h.SafeBytes),
					zap.String("wal_status", h.WALStatus))
			}
			warned = over
		}
	}
}

// slotLost is the FatalError for a slot of schema's outbox that is missing or invalidated at a
// relay's start, naming what was lost from the checkpoint ck on this server's timeline
// history tl: the events of the transactions committed after ck's commit LSN (on its
// timeline, up to that timeline's end when the server has moved past it), until the slot was
// lost. Writers refuse to emit without the slot (SQLSTATE KX002), so nothing later is lost.
// The recovery commands are filled in with the schema and the checkpoint's time.
func slotLost(h Health, slot, schema string, ck checkpoint, tl timelines) error {
	why := "does not exist on this server (a failover to a node without a copy of it, or it was dropped)"
	if !h.Missing {
		why = "was invalidated (wal_status lost: it retained more than max_slot_wal_keep_size)"
	}
	return slotLostWhy(why, !h.Missing, slot, schema, ck, tl)
}

// slotUnreadable turns the stream's error into slotLost's FatalError when the server can never
// stream the slot: SQLSTATE 58P01, "requested WAL segment … has already been removed" — the
// slot exists (wal_status may even read reserved) but the WAL from its restart_lsn is gone on
// this server, as when a copy of the slot (a Patroni permanent slot after several failovers)
// points into a segment the promoted node never had or already recycled. Retrying can never
// succeed, so it stops the relay with what was lost and the recovery commands (the slot
// dropped first: migrate up refuses to keep it) instead of reconnecting for ever. Any other
// error is returned as it is.
func slotUnreadable(err error, slot, schema string, ck checkpoint, tl timelines) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "58P01" {
		return err
	}
	return slotLostWhy("cannot be streamed: the WAL it needs was removed on this server ("+pe.Message+"; a slot copied to a standby that lacks its WAL, "+
		"e.g. after several failovers)", true, slot, schema, ck, tl)
}

// slotLostWhy is slotLost's FatalError for a slot that cannot be streamed for the reason why;
// drop: the slot exists and must be dropped before it is recreated.
func slotLostWhy(why string, drop bool, slot, schema string, ck checkpoint, tl timelines) error {
	since := "since the slot was created (no checkpoint was ever published)"
	replayFrom := "--to-earliest"
	if ck.LSN != 0 {
		tli := ck.Timeline
		if tli == 0 {
			tli = tl.of(ck.LSN)
		}
		since = fmt.Sprintf("after commit LSN %s on timeline %d (the checkpoint published %s)", ck.LSN, tli, ck.At.Format(time.RFC3339))
		if end, ok := tl.ended(tli); ok {
			since += fmt.Sprintf(", up to that timeline's end at %s, and on timeline %d", end, tl.current)
		}
		replayFrom = "--to-time " + ck.At.Add(-time.Second).UTC().Format(time.RFC3339)
	}
	until := "until the slot was lost (writers refuse to emit without it, so none later)"
	if drop {
		// The slot exists: writers still emit into WAL it can never deliver.
		until = "until the slot is dropped (writers still emit while it exists: drop it at once)"
	}
	return &FatalError{fmt.Errorf("walrelay: replication slot %s %s; server timeline %d. Lost: the events of the transactions committed %s %s. "+
		"Recover: %s (a new slot; writers resume), then process those inputs again: "+
		"%s (the handlers run again in a new replay epoch; when their effects must not repeat, "+
		"republish from the services' own tables instead: docs/outbox-wal.md, Recovery). Keep the slot across failovers: a Patroni permanent slot or PostgreSQL 17 failover slots (docs/deployment.md)",
		slot, why, tl.current, since, until, outbox.RecoverSlotSteps(schema, drop),
		offsetstate.ResetStep(schema, "GROUP", "TOPIC", -1, replayFrom, "replay", msgfmt.Quote))}
}
