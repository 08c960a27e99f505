package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/outbox"
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
