package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/outbox"
	"github.com/kafkatx/kafkatx/pg"
)

// WaitBelow returns at once under its bound, waits while the outbox's live-row estimate is
// over it (until ctx ends), and returns once rows are deleted; rows <= 0 never waits; a
// schema without an outbox is a clear error.
func TestWaitBelowFollowsTheOutboxRowEstimate(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	w := outbox.Writer{Schema: b.schema}
	recs := make([]outbox.Record, 50)
	for i := range recs {
		recs[i] = outbox.Record{Topic: "t", Value: []byte("v")}
	}
	if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { _, err := w.WriteTx(ctx, tx, recs...); return err }); err != nil {
		t.Fatal(err)
	}
	// Each session reports its row counts as its transactions end, at most ~10 s late when it
	// goes idle at once (PostgreSQL's idle flush): poll for the estimate, not for a moment.
	over := w.WaitBelow(b.pool, 10)
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		err := over(c)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			break // waiting: the estimate sees the 50 rows
		}
		if err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("WaitBelow(10) never waited with 50 rows in the outbox")
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := w.WaitBelow(b.pool, 100)(ctx); err != nil {
		t.Fatalf("WaitBelow(100) with 50 rows: %v, want nil at once", err)
	}
	if err := w.WaitBelow(b.pool, 0)(ctx); err != nil {
		t.Fatalf("WaitBelow(0): %v, want nil (no bound)", err)
	}
	done := make(chan error, 1)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	go func() { done <- over(wctx) }()
	if _, err := b.pool.Exec(ctx, `DELETE FROM `+b.t.Outbox); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("WaitBelow(10) after the rows were deleted: %v, want nil", err)
	}
	err := outbox.Writer{Schema: "no_such_schema_here"}.WaitBelow(b.pool, 10)(ctx)
	if err == nil || !strings.Contains(err.Error(), "no table") {
		t.Fatalf("WaitBelow on a schema without an outbox: %v, want a 'no table' error", err)
	}
}

// driftQuerier answers the live-row estimate with a fixed figure, as PostgreSQL's does after
// a vacuum or analyze sampled it (seen: 474–685 estimated rows in an empty outbox), and passes
// every other query to the database.
type driftQuerier struct {
	pg.Querier
	estimate int64
}

type fixedRow struct{ n int64 }

func (r fixedRow) Scan(dest ...any) error { *(dest[0].(*int64)) = r.n; return nil }

func (d driftQuerier) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if strings.Contains(sql, "n_live_tup") {
		return fixedRow{d.estimate}
	}
	return d.Querier.QueryRow(ctx, sql, args...)
}

// An estimate stuck above the bound over an outbox that holds fewer open rows does not hold
// the consumer: WaitBelow counts the open rows before it waits. Without the count this waited
// for ever on an empty outbox (the estimate changes only when something writes).
func TestWaitBelowCountsBeforeWaitingOnAStaleEstimate(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	w := outbox.Writer{Schema: b.schema}
	wait := w.WaitBelow(driftQuerier{Querier: b.pool, estimate: 685}, 300)
	c, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := wait(c); err != nil {
		t.Fatalf("WaitBelow(300) with an estimate of 685 over an empty outbox: %v, want nil", err)
	}
	recs := make([]outbox.Record, 301)
	for i := range recs {
		recs[i] = outbox.Record{Topic: "t", Value: []byte("v")}
	}
	if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { _, err := w.WriteTx(ctx, tx, recs...); return err }); err != nil {
		t.Fatal(err)
	}
	wait = w.WaitBelow(driftQuerier{Querier: b.pool, estimate: 685}, 300)
	c2, cancel2 := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel2()
	if err := wait(c2); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitBelow(300) with 301 open rows: %v, want it to wait until the deadline", err)
	}
}
