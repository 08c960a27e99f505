package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/pg"
)

// backpressureInterval is how often WaitBelow reads again while it waits, and how long a
// WAL-mode slot lag it read is trusted.
const backpressureInterval = 100 * time.Millisecond

// WaitBelow returns a function for kafkatx.Config.Backpressure: it returns nil at once while
// w.Schema's outbox holds at most rows open records (pending or parked; a packed row counts
// the records it holds, Writer.Pack), and otherwise waits
// until it does (or ctx ends: then ctx's error). rows <= 0 returns a function that never
// waits.
//
// Table mode: it answers "under" only from what it read, never from a statistic that lags.
// The rows it knows of are the last exact count of the open rows (up to rows+1), plus every
// id the outbox's id sequence handed out since (pg_sequence_last_value), plus the open rows
// of the transactions that count's snapshot could not see (running then, committed since).
// A packed row's records each take an id of the sequence (and the row one more), so the
// sequence bounds records as it bounds rows. That sum is at least the open rows (rows published or rolled back since still count), so
// while it is at most rows the answer is true; once it passes rows, the rows are counted
// again (at most once a second: a count of 100,000 rows costs about 80 ms; until then it waits). Each call reads the sequence (one query:
// a sequence page and an index lookup of those few transactions), under a lock shared by
// every caller of the returned function, whoever the relay is (in-process or `kafkatx
// relay`). So the outbox passes rows only by what writer transactions already past their
// check add: one batch per partition (and lane) whose check answered before the others' ids
// were taken (TestWaitBelowHoldsItsBoundWhileTheDatabaseTimesItsReadsOut). Parked rows count
// (a relay that parks more than rows holds the consumer until an operator acts). A read that
// fails (cancelled by statement_timeout, the database unreachable, a role without USAGE or
// SELECT on the sequence) returns its error, so the consumer holds the batch
// (Config.Backpressure's bounded hold): a check that cannot answer truthfully does not
// answer. Writers take id from the column's sequence (the table contract,
// docs/outbox-table.md); a table whose id has no sequence is an error.
//
// In WAL mode (Mode; read every 2 s) it waits instead while the schema's slot's lag —
// pg_current_wal_lsn() - confirmed_flush_lsn, the WAL the relay has not confirmed, business
// writes included, read at most every 100 ms — passes rows × WALBytesPerRow bytes.
//
// Keep rows at several seconds of the relay's rate: partitions that wait for the next count
// while the relay has already drained the outbox lose rate (docs/relay.md).
func (w Writer) WaitBelow(q pg.Querier, rows int64) func(context.Context) error {
	if rows <= 0 {
		return func(context.Context) error { return nil }
	}
	e := &liveRows{q: q, table: tables.For(w.schema()).Outbox, bound: rows, schema: w.schema()}
	return func(ctx context.Context) error {
		for {
			over, err := e.over(ctx)
			if err != nil {
				e.recycle.After(e.q, err) // a session opened under a short statement_timeout keeps it
				return err
			}
			if !over {
				return nil
			}
			t := time.NewTimer(backpressureInterval)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
		}
	}
}

// countInterval is how often WaitBelow counts the open rows, at most, while the rows it knows
// of (the last count plus the ids handed out since) are over the bound.
const countInterval = time.Second

// liveRows decides whether the outbox is over bound. Table mode: the last exact count of the
// open rows (counted, up to bound+1) and the id sequence's value read just before it
// (countSeq); the sequence's value now (seq, read at most every backpressureInterval) bounds
// the rows written since. WAL mode: the slot's lag in bytes, read at most every
// backpressureInterval.
type liveRows struct {
	q       pg.Querier
	recycle pg.TimeoutRecycler
	table   string // quoted
	bound   int64

	mu        sync.Mutex
	at        time.Time // seq (table mode) or lag (WAL mode) read
	seq       int64     // the id sequence's last value (0 before its first use)
	lag       int64     // WAL mode: the slot's lag in bytes
	countedAt time.Time // zero: no count yet, or the sequence changed identity
	counted   int64     // open rows at the last count (at most bound+1)
	countSeq  int64     // seq just before that count
	// The transactions running at that count's snapshot (xid8 as text): its xip list, and
	// from its xmax (nil before a count) to the count's own xid.
	countRunning []string
	countXmax    *string
	countNext    string
	late         int64 // their open rows with ids up to countSeq, committed since: read with seq

	schema  string
	modeAt  time.Time // mode read
	wal     bool      // WAL mode
	slot    string
	seqName string // the id column's sequence (table mode), regclass text
}

func (e *liveRows) over(ctx context.Context) (bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.readMode(ctx); err != nil {
		return false, err
	}
	fresh := !e.at.IsZero() && time.Since(e.at) < backpressureInterval
	if e.wal {
		if !fresh {
			lag, err := e.readLag(ctx)
			if err != nil {
				return false, err
			}
			e.at, e.lag = time.Now(), lag
		}
		return e.lag > e.bound*WALBytesPerRow, nil
	}
	// Read at every call: a value cached for even 100 ms let the writers of those 100 ms
	// through unseen (900 rows past a bound of 3,000 in TestWaitBelowHoldsItsBoundWhileThe
	// DatabaseTimesItsReadsOut). One call's query is one sequence page read, and index
	// lookups of the transactions the last count could not see.
	var seq, late int64
	err := e.q.QueryRow(ctx, `SELECT coalesce(pg_sequence_last_value($1::regclass), 0),
		CASE WHEN $4::text IS NULL THEN 0 ELSE (SELECT coalesce(sum(o.pack_count), 0) FROM `+e.table+` o
			WHERE (o.txid = ANY($2::text[]::xid8[]) OR o.txid >= $4::text::xid8 AND o.txid < $5::text::xid8)
			  AND CASE WHEN o.state = 'packed' THEN o.pack_ids[1] ELSE o.id END <= $3
			  AND o.state IN ('pending', 'parked', 'packed')) END`,
		e.seqName, e.countRunning, e.countSeq, e.countXmax, e.countNext).Scan(&seq, &late)
	if err != nil {
		return false, fmt.Errorf("outbox: read the outbox's id sequence: %w", err)
	}
	e.at, e.seq, e.late = time.Now(), seq, late
	if e.known() <= e.bound {
		return false, nil
	}
	if !e.countedAt.IsZero() && time.Since(e.countedAt) < countInterval {
		return true, nil // over, as far as it can tell until the next count
	}
	// The count's statement takes its snapshot after seq was read: a row with an id up to seq
	// is counted, or its transaction was running at the snapshot — listed in its xip, or at
	// or past its xmax (PostgreSQL's xmax is the last completed xid + 1, and running ones
	// past it are not listed) and before the xid the statement takes for itself — and later
	// calls count it once it commits; a later id is in seq's growth. The statement's own xid
	// is one per count, at most every countInterval.
	var n int64
	var running []string
	var xmax, next string
	err = e.q.QueryRow(ctx, `SELECT (SELECT coalesce(sum(x.n), 0) FROM (SELECT o.pack_count AS n FROM `+e.table+` o
		WHERE o.state IN ('pending', 'parked', 'packed') LIMIT $1) x),
		ARRAY(SELECT x::text FROM pg_snapshot_xip(pg_current_snapshot()) x),
		pg_snapshot_xmax(pg_current_snapshot())::text, pg_current_xact_id()::text`, e.bound+1).Scan(&n, &running, &xmax, &next)
	if err != nil {
		return false, fmt.Errorf("outbox: count the outbox's open rows: %w", err)
	}
	e.countedAt, e.counted, e.countSeq, e.late = time.Now(), n, seq, 0
	e.countRunning, e.countXmax, e.countNext = running, &xmax, next
	return n > e.bound, nil
}

// known is the most open rows the outbox can hold by what liveRows read: the last count plus
// the ids handed out since; more than the bound when it cannot tell (no count yet, or a
// sequence that went back: ALTER SEQUENCE … RESTART, a new table).
func (e *liveRows) known() int64 {
	if e.countedAt.IsZero() || e.seq < e.countSeq {
		return e.bound + 1
	}
	return e.counted + e.late + (e.seq - e.countSeq)
}

// WALBytesPerRow converts WaitBelow's bound in WAL mode: the slot's lag (WAL not yet
// confirmed by the relay, business writes included) may reach rows × 1 KiB.
const WALBytesPerRow = 1024

// readMode reads the schema's outbox mode (and, in table mode, the name of the outbox's id
// sequence) when the last read is older than modeTTL.
func (e *liveRows) readMode(ctx context.Context) error {
	if !e.modeAt.IsZero() && time.Since(e.modeAt) < modeTTL {
		return nil
	}
	s, err := ReadSettings(ctx, e.q, e.schema)
	if err != nil {
		return err
	}
	wal, seqName := s.Mode == ModeWAL, ""
	if !wal {
		var exists bool
		if err := e.q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, e.table).Scan(&exists); err != nil {
			return fmt.Errorf("outbox: look up the outbox table: %w", err)
		}
		if !exists {
			return fmt.Errorf("outbox: read the outbox's open rows: no table %s", e.table)
		}
		var name *string
		if err := e.q.QueryRow(ctx, `SELECT pg_get_serial_sequence($1, 'id')`, e.table).Scan(&name); err != nil {
			return fmt.Errorf("outbox: look up the outbox's id sequence: %w", err)
		}
		if name == nil {
			return fmt.Errorf("outbox: %s.id has no sequence (the table contract: id bigserial, docs/outbox-table.md)", e.table)
		}
		seqName = *name
	}
	if seqName != e.seqName {
		e.countedAt = time.Time{} // another sequence: counts against the old one mean nothing
	}
	e.wal, e.slot, e.seqName, e.modeAt = wal, s.Slot, seqName, time.Now()
	return nil
}

// readLag reads the WAL-mode slot's lag in bytes: WAL written and not confirmed by the relay.
func (e *liveRows) readLag(ctx context.Context) (int64, error) {
	var lag *int64
	err := e.q.QueryRow(ctx, `SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $1`, e.slot).Scan(&lag)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("outbox: read the slot's lag: no slot %s", e.slot)
	}
	if err != nil {
		return 0, fmt.Errorf("outbox: read the slot's lag: %w", err)
	}
	if lag == nil {
		return 0, nil
	}
	return *lag, nil
}
