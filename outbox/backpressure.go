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
// w.Schema's outbox table holds at most rows live rows, and otherwise waits until it does
// (or ctx ends: then ctx's error). rows <= 0 returns a function that never waits.
//
// The count is PostgreSQL's running estimate of the table's live rows
// (pg_stat_user_tables.n_live_tup: rows inserted minus rows deleted, which each session
// reports as its transactions end, at most about a second late), read through q at most
// every 100 ms and shared by every caller of the returned function: one small query, not a
// count of the table, whoever the relay is (in-process or `kafkatx relay`). So the outbox
// can pass rows by what the writers add in about a second; parked rows and rows the relay
// keeps as published (KeepPublished) count too; with track_counts off the estimate stays 0
// and nothing waits. A failed read returns its error (the consumer logs it and goes on).
// Keep rows at several seconds of the relay's rate: with a bound the relay drains within the
// estimate's second, partitions wait while it has already caught up (on the 2-core test
// machine 20,000 rows halved the end-to-end rate of a 300,000-order drain; 100,000 kept the
// outbox at 109,673 rows instead of 163,000 at no cost in speed: docs/relay.md).
func (w Writer) WaitBelow(q pg.Querier, rows int64) func(context.Context) error {
	if rows <= 0 {
		return func(context.Context) error { return nil }
	}
	e := &liveRows{q: q, table: tables.For(w.schema()).Outbox}
	return func(ctx context.Context) error {
		for {
			n, err := e.read(ctx)
			if err != nil {
				return err
			}
			if n <= rows {
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

// liveRows caches the outbox's n_live_tup for backpressureInterval.
type liveRows struct {
	q     pg.Querier
	table string // quoted

	mu   sync.Mutex
	at   time.Time
	rows int64
}

func (e *liveRows) read(ctx context.Context) (int64, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.at.IsZero() && time.Since(e.at) < backpressureInterval {
		return e.rows, nil
	}
	var n int64
	err := e.q.QueryRow(ctx, `SELECT s.n_live_tup FROM pg_stat_user_tables s WHERE s.relid = to_regclass($1)`, e.table).Scan(&n)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("outbox: read the outbox's row estimate: no table %s", e.table)
	}
	if err != nil {
		return 0, fmt.Errorf("outbox: read the outbox's row estimate: %w", err)
	}
	e.at, e.rows = time.Now(), n
	return e.rows, nil
}
