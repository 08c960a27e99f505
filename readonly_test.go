package kafkatx

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// A switchover as it looks from an application: the database turns read-only (the old primary
// stays up, every write fails with SQLSTATE 25006, pings still answer) while the consumer
// drains a backlog, then writable again. The read-only sessions are not ended when it turns
// back: only discarding them (the consumer resets its pool on 25006) reaches the writable
// server. Every message applied exactly once, none counted as an attempt or dead-lettered.
func TestReadOnlySwitchIsRiddenOutWithoutAttempts(t *testing.T) {
	t.Parallel()
	b, admin, dbName := setupOwnDatabase(t, "kafkatx_readonly", 2)
	ctx := context.Background()
	const n = 3000
	produce(t, b.brokers, b.topic, values(n, -1, func(i int) string { return fmt.Sprint(i) }))
	cfg := b.config(t)
	cfg.Batch.Size = 50
	cfg.Retry.MaxAttempts = 1 // a read-only error counted as an attempt would dead-letter at once
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		time.Sleep(200 * time.Microsecond)
		return applyEffect(ctx, tx, b.schema, m)
	}
	effects := pgx.Identifier{b.schema, "effects"}.Sanitize()
	count := func() int64 {
		var c int64
		_ = b.pool.QueryRow(ctx, "SELECT count(*) FROM "+effects).Scan(&c)
		return c
	}
	db := pgx.Identifier{dbName}.Sanitize()
	r := b.start(t, h, cfg)
	waitFor(t, 60*time.Second, "the drain under way", func() bool { return count() > 100 })
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+db+" SET default_transaction_read_only = on"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid() AND backend_type = 'client backend'", dbName); err != nil { // not an autovacuum worker, a superuser process (42501)
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	before := count()
	time.Sleep(2 * time.Second)
	if after := count(); after != before {
		t.Fatalf("%d effects written while the database was read-only", after-before)
	}
	// Writable again; the read-only sessions the pool opened meanwhile stay read-only.
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+db+" RESET default_transaction_read_only"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "every message applied after the switch back", func() bool { return count() == n })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if d := b.q(t, "SELECT count(*) FROM {{schema}}.effects WHERE applied <> 1"); d != 0 {
		t.Fatalf("%d duplicate effects", d)
	}
	if d := b.q(t, "SELECT count(*) FROM {{schema}}.dead_letters"); d != 0 {
		t.Fatalf("%d dead letters: a read-only error was counted as an attempt", d)
	}
	if d := b.q(t, "SELECT count(*) FROM {{schema}}.attempts"); d != 0 {
		t.Fatalf("%d attempt rows left", d)
	}
	if w := b.q(t, "SELECT sum(next_offset) FROM {{schema}}.watermarks"); w != n {
		t.Fatalf("watermarks sum to %d, want %d", w, n)
	}
	if s := r.c.Stats(); s.Retries != 0 || s.DeadLettered != 0 {
		t.Fatalf("stats: %d retries, %d dead-lettered, want 0 and 0", s.Retries, s.DeadLettered)
	}
}
