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

// backpressureInterval is how often WaitBelow reads the outbox's row estimate, at most.
const backpressureInterval = 100 * time.Millisecond

// WaitBelow returns a function for kafkatx.Config.Backpressure: it returns nil at once while
// w.Schema's outbox holds at most rows open rows (pending or parked), and otherwise waits
// until it does (or ctx ends: then ctx's error). rows <= 0 returns a function that never
// waits.
//
// It reads PostgreSQL's running estimate of the table's live rows first
// (pg_stat_user_tables.n_live_tup), through q, at most every 100 ms, shared by every caller of
// the returned function: one small query, whoever the relay is (in-process or `kafkatx
// relay`). Only when the estimate is over rows does it count the open rows themselves, up to
// rows+1 (at most once a second while over), and it waits only on that count: the estimate
// lags about a second behind the writers, and vacuum and analyze replace it with a sample's,
// which can stay above an empty table for as long as nothing writes to it. So the outbox can
// pass rows by what the writers add in about a second; parked rows count (a relay that parks
// more than rows holds the consumer until an operator acts); with track_counts off the
// estimate stays 0 and nothing waits. A failed read returns its error (the consumer logs it
// and goes on).
//
// In WAL mode (Mode; read every 2 s) it waits instead while the schema's slot's lag —
// pg_current_wal_lsn() - confirmed_flush_lsn, the WAL the relay has not confirmed, business
// writes included — passes rows × WALBytesPerRow bytes.
//
// Keep rows at several seconds of the relay's rate: with a bound the relay drains within the
// estimate's second, partitions wait while it has already caught up (on the 2-core test
// machine 20,000 rows halved the end-to-end rate of a 300,000-order drain; 100,000 kept the
// outbox at 109,673 rows instead of 163,000 at no cost in speed: docs/relay.md).
func (w Writer) WaitBelow(q pg.Querier, rows int64) func(context.Context) error {
	if rows <= 0 {
		return func(context.Context) error { return nil }
	}
	e := &liveRows{q: q, table: tables.For(w.schema()).Outbox, bound: rows, schema: w.schema()}
	return func(ctx context.Context) error {
		for {
			over, err := e.over(ctx)
			if err != nil {
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

// countInterval is how often WaitBelow counts the open rows, at most, while the estimate is
// over the bound.
const countInterval = time.Second

// liveRows decides whether the outbox is over bound: the estimate (n_live_tup) cached for
// backpressureInterval, and when it is over, the open rows counted up to bound+1, cached for
// countInterval.
type liveRows struct {
	q     pg.Querier
	table string // quoted
	bound int64

	mu        sync.Mutex
	at        time.Time // estimate read
	estimate  int64
	countedAt time.Time
	counted   bool // the count's answer: over bound

	schema string
	modeAt time.Time // mode read
	wal    bool      // WAL mode: estimate is the slot's lag in bytes
	slot   string
}

func (e *liveRows) over(ctx context.Context) (bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.at.IsZero() || time.Since(e.at) >= backpressureInterval {
		n, err := e.readEstimate(ctx)
		if err != nil {
			return false, err
		}
		e.at, e.estimate = time.Now(), n
	}
	if e.wal {
		return e.estimate > e.bound*WALBytesPerRow, nil
	}
	if e.estimate <= e.bound {
		return false, nil
	}
	if e.countedAt.IsZero() || time.Since(e.countedAt) >= countInterval {
		var n int64
		err := e.q.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM `+e.table+` o
			WHERE o.state IN ('pending', 'parked') LIMIT $1) x`, e.bound+1).Scan(&n)
		if err != nil {
			return false, fmt.Errorf("outbox: count the outbox's open rows: %w", err)
		}
		e.countedAt, e.counted = time.Now(), n > e.bound
	}
	return e.counted, nil
}

// WALBytesPerRow converts WaitBelow's bound in WAL mode: the slot's lag (WAL not yet
// confirmed by the relay, business writes included) may reach rows × 1 KiB.
const WALBytesPerRow = 1024

func (e *liveRows) readEstimate(ctx context.Context) (int64, error) {
	if e.modeAt.IsZero() || time.Since(e.modeAt) >= modeTTL {
		s, err := ReadSettings(ctx, e.q, e.schema)
		if err != nil {
			return 0, err
		}
		e.wal, e.slot, e.modeAt = s.Mode == ModeWAL, s.Slot, time.Now()
	}
	if e.wal {
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
	var n int64
	err := e.q.QueryRow(ctx, `SELECT s.n_live_tup FROM pg_stat_user_tables s WHERE s.relid = to_regclass($1)`, e.table).Scan(&n)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("outbox: read the outbox's row estimate: no table %s", e.table)
	}
	if err != nil {
		return 0, fmt.Errorf("outbox: read the outbox's row estimate: %w", err)
	}
	return n, nil
}
