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

// WaitBelow returns at once under its bound, waits while the outbox holds more open rows
// (until ctx ends), and returns once rows are deleted; rows <= 0 never waits; a
// schema without an outbox is a clear error.
func TestWaitBelowFollowsTheOutboxsOpenRows(t *testing.T) {
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
	over := w.WaitBelow(b.pool, 10)
	deadline := time.Now().Add(60 * time.Second)
	for {
		c, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		err := over(c)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			break // waiting: it counted the 50 rows
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

// Ids handed out by transactions that rolled back (or rows deleted since) make the rows
// WaitBelow knows of pass the bound while the outbox holds fewer: it counts the open rows
// before it waits, and waits only on the count.
func TestWaitBelowCountsBeforeWaitingOnIdsHandedOut(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	w := outbox.Writer{Schema: b.schema}
	wait := w.WaitBelow(b.pool, 300)
	if err := wait(ctx); err != nil { // the first count: an empty outbox
		t.Fatal(err)
	}
	write := func(n int, commit bool) {
		t.Helper()
		recs := make([]outbox.Record, n)
		for i := range recs {
			recs[i] = outbox.Record{Topic: "t", Value: []byte("v")}
		}
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := w.WriteTx(ctx, tx, recs...); err != nil {
			t.Fatal(err)
		}
		if commit {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(1000, false) // 1,000 ids handed out, no row
	c, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := wait(c); err != nil {
		t.Fatalf("WaitBelow(300) after 1,000 ids rolled back over an empty outbox: %v, want nil", err)
	}
	write(301, true)
	c2, cancel2 := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel2()
	if err := wait(c2); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitBelow(300) with 301 open rows: %v, want it to wait until the deadline", err)
	}
}
