package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
	"github.com/kafkatx/kafkatx/pg"
)

// Issue "outages" 1: with statement_timeout = 1ms set on the database while no relay drains
// the outbox, orders' --max-outbox-rows 20000 was passed by 4,000 rows (a bound of 3,000 here by 7,950 before the fix): WaitBelow answered
// "under" from PostgreSQL's live-row estimate, which its fast query still read within 1 ms,
// about a second (up to 10 s for an idle session) behind the writers. Here writers that run a
// batch of 50 rows each time the check lets them (as the consumer's partitions do: a failing
// check holds the batch) fill an outbox with no relay while the checker's sessions run under
// the database's statement_timeout = 1ms (ALTER DATABASE; the writers' own sessions lift it,
// as the consumer's SET LOCAL does): the outbox never passes the bound by more than one batch
// per writer. Five rounds; each starts half full with the check answering, then 1 ms.
func TestWaitBelowHoldsItsBoundWhileTheDatabaseTimesItsReadsOut(t *testing.T) {
	dsn := testenv.Database(t)
	ctx := context.Background()
	admin := connectTo(t, dsn, nil)
	schema := testenv.Schema(t, admin)
	if _, err := migrations.Apply(ctx, admin, schema); err != nil {
		t.Fatal(err)
	}
	outboxT := tables.For(schema).Outbox
	var db string
	if err := admin.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	setTimeout := func(v string) {
		t.Helper()
		q := `ALTER DATABASE ` + pgx.Identifier{db}.Sanitize() + ` RESET statement_timeout`
		if v != "" {
			q = `ALTER DATABASE ` + pgx.Identifier{db}.Sanitize() + ` SET statement_timeout = '` + v + `'`
		}
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { setTimeout("") })
	writers := connectTo(t, dsn, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["statement_timeout"] = "0" })
	// The checker's sessions end after 200 ms, so the database's setting reaches them soon.
	checker := connectTo(t, dsn, func(c *pgxpool.Config) { c.MaxConnLifetime = 200 * time.Millisecond })
	const bound, batch, nWriters = 3000, 50, 4
	w := outbox.Writer{Schema: schema}
	recs := make([]outbox.Record, batch)
	for i := range recs {
		recs[i] = outbox.Record{Topic: "t", Key: []byte(fmt.Sprint(i)), Value: []byte("v")}
	}
	open := func() int64 {
		t.Helper()
		var n int64
		if err := writers.QueryRow(ctx, `SELECT count(*) FROM `+outboxT+` WHERE state IN ('pending', 'parked')`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for round := 1; round <= 5; round++ {
		setTimeout("")
		if _, err := writers.Exec(ctx, `DELETE FROM `+outboxT); err != nil {
			t.Fatal(err)
		}
		check := w.WaitBelow(checker, bound)
		var stop atomic.Bool
		var wrote, failed atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, nWriters)
		for range nWriters {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !stop.Load() {
					c, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
					err := check(c)
					cancel()
					if err != nil && !errors.Is(err, context.DeadlineExceeded) {
						failed.Add(1)
					}
					if err != nil { // waiting, or a check that cannot answer: the batch is held
						time.Sleep(20 * time.Millisecond)
						continue
					}
					if err := pgx.BeginFunc(ctx, writers, func(tx pgx.Tx) error { _, err := w.WriteTx(ctx, tx, recs...); return err }); err != nil {
						errs <- err
						return
					}
					wrote.Add(batch)
				}
			}()
		}
		deadline := time.Now().Add(30 * time.Second)
		for wrote.Load() < bound/2 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		setTimeout("1ms")
		failedBefore := failed.Load()
		time.Sleep(6 * time.Second)
		stop.Store(true)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("round %d: a writer failed: %v", round, err)
		}
		if failed.Load() == failedBefore {
			t.Fatalf("round %d: the check never failed under statement_timeout = 1ms; the test did not test it", round)
		}
		n := open()
		t.Logf("round %d: %d open rows (bound %d, one batch of %d per writer: %d writers)", round, n, bound, batch, nWriters)
		if n > bound+nWriters*batch {
			t.Fatalf("round %d: %d open rows with statement_timeout = 1ms and no relay; want at most the bound %d plus one batch of %d per writer (%d)",
				round, n, bound, batch, bound+nWriters*batch)
		}
		if n < bound/2 {
			t.Fatalf("round %d: only %d open rows written; the check let too little through to mean anything", round, n)
		}
	}
}

// connectTo opens a pool on dsn, changed by edit first when set, closed when the test ends.
func connectTo(t *testing.T, dsn string, edit func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pg.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}
