package idempotency_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/kafkatx/kafkatx/idempotency"
)

func (b *testBundle) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+pgx.Identifier{b.schema, table}.Sanitize()).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// seed inserts n keys that expired and live ones, and expired and live stored responses.
func (b *testBundle) seed(t *testing.T, expired, live int) {
	t.Helper()
	ctx := context.Background()
	keys := pgx.Identifier{b.schema, "idempotency_keys"}.Sanitize()
	resp := pgx.Identifier{b.schema, "idempotency_responses"}.Sanitize()
	for _, q := range []string{
		fmt.Sprintf(`INSERT INTO %s (scope, key, expires_at) SELECT 'g', convert_to('old-' || i || '-' || random(), 'UTF8'), now() - interval '1 second' FROM generate_series(1, %d) i`, keys, expired),
		fmt.Sprintf(`INSERT INTO %s (scope, key, expires_at) SELECT 'g', convert_to('live-' || i || '-' || random(), 'UTF8'), now() + interval '1 hour' FROM generate_series(1, %d) i`, keys, live),
		fmt.Sprintf(`INSERT INTO %s (scope, key, fingerprint, method, request_uri, status, body, expires_at) SELECT '', 'old-' || i || '-' || random(), '\x00', 'POST', '/', 200, '', now() - interval '1 second' FROM generate_series(1, %d) i`, resp, expired),
		fmt.Sprintf(`INSERT INTO %s (scope, key, fingerprint, method, request_uri, status, body, expires_at) SELECT '', 'live-' || i || '-' || random(), '\x00', 'POST', '/', 200, '', now() + interval '1 hour' FROM generate_series(1, %d) i`, resp, live),
	} {
		if _, err := b.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
}

func TestJanitorSweepsInBatches(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.seed(t, 2500, 10)
	j := idempotency.NewJanitor(b.pool, &idempotency.JanitorConfig{Schema: b.schema, BatchSize: 1000})
	n, err := j.Sweep(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if n != 5000 {
		t.Fatalf("swept %d rows, want 5000", n)
	}
	if k, r := b.count(t, "idempotency_keys"), b.count(t, "idempotency_responses"); k != 10 || r != 10 {
		t.Fatalf("left %d keys and %d responses, want the 10 live ones of each", k, r)
	}
}

// TestJanitorSkipsLockedRows: a row held by an open transaction (a claim taking over an
// expired key) is left alone rather than waited for.
func TestJanitorSkipsLockedRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.seed(t, 3, 0)
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := tx.Exec(ctx, "SELECT 1 FROM "+pgx.Identifier{b.schema, "idempotency_keys"}.Sanitize()+" LIMIT 1 FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	n, err := idempotency.NewJanitor(b.pool, &idempotency.JanitorConfig{Schema: b.schema, BatchSize: 1}).Sweep(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if n != 5 {
		t.Fatalf("swept %d rows, want 5 (one key locked)", n)
	}
}

func TestJanitorRun(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) }) // after the pool closes
	b := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	j := idempotency.NewJanitor(b.pool, &idempotency.JanitorConfig{Schema: b.schema, Interval: 50 * time.Millisecond})
	done := make(chan error, 1)
	go func() { done <- j.Run(ctx) }()
	b.seed(t, 20, 2)
	deadline := time.Now().Add(60 * time.Second)
	for b.count(t, "idempotency_keys") != 2 || b.count(t, "idempotency_responses") != 2 {
		if time.Now().After(deadline) {
			t.Fatal("Run did not delete the expired rows within 60s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}
