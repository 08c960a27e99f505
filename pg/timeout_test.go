package pg_test

import (
	"context"
	"testing"
	"time"

	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/pg"
)

// SessionTimedOut tells the session's statement_timeout from a cancel request (a cancelled
// context), and TimeoutRecycler recycles a pool only for the first, at most once per
// RecycleEvery.
func TestSessionTimedOutAndTheRecycler(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `SET statement_timeout = '50ms'`); err != nil {
		t.Fatal(err)
	}
	_, timedOut := conn.Exec(ctx, `SELECT pg_sleep(1)`)
	if _, err := conn.Exec(ctx, `RESET statement_timeout`); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, cancelled := conn.Exec(cctx, `SELECT pg_sleep(1)`)
	cancel()
	conn.Release()
	if !pg.SessionTimedOut(timedOut) {
		t.Fatalf("SessionTimedOut(%v) = false", timedOut)
	}
	if cancelled == nil || pg.SessionTimedOut(cancelled) {
		t.Fatalf("SessionTimedOut(%v) = true for a cancelled context", cancelled)
	}
	var r pg.TimeoutRecycler
	if r.After(pool, cancelled) {
		t.Fatal("recycled after a cancel request")
	}
	if !r.After(pool, timedOut) {
		t.Fatal("did not recycle after the session's statement timeout")
	}
	if r.After(pool, timedOut) {
		t.Fatalf("recycled twice within RecycleEvery (%v)", pg.RecycleEvery)
	}
}
