package kafkatx

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestDatabaseOutagesAreRiddenOutWithoutLossOrAttempts cuts the consumer's database
// connections and refuses new ones, five times while it drains a backlog: every message
// must still be applied exactly once, none counted as an attempt or dead-lettered.
func TestDatabaseOutagesAreRiddenOutWithoutLossOrAttempts(t *testing.T) {
	t.Parallel()
	b, admin, dbName := setupOwnDatabase(t, "kafkatx_outage", 2)
	ctx := context.Background()
	const n = 3000
	produce(t, b.brokers, b.topic, values(n, -1, func(i int) string { return fmt.Sprint(i) }))
	cfg := b.config(t)
	cfg.Batch.Size = 50
	cfg.Retry.MaxAttempts = 1 // any outage counted as an attempt would dead-letter at once
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		time.Sleep(100 * time.Microsecond)
		return applyEffect(ctx, tx, b.schema, m)
	}
	r := b.start(t, h, cfg)
	for i := 0; i < 5; i++ {
		time.Sleep(300 * time.Millisecond)
		if _, err := admin.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s ALLOW_CONNECTIONS false", pgx.Identifier{dbName}.Sanitize())); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid() AND backend_type = 'client backend'", dbName); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		if _, err := admin.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s ALLOW_CONNECTIONS true", pgx.Identifier{dbName}.Sanitize())); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 120*time.Second, "every message applied", func() bool {
		var c int64
		return b.pool.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM %s", pgx.Identifier{b.schema, "effects"}.Sanitize())).Scan(&c) == nil && c == n
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if d := b.q(t, "SELECT count(*) FROM {{schema}}.effects WHERE applied <> 1"); d != 0 {
		t.Fatalf("%d duplicate effects after outages", d)
	}
	if d := b.q(t, "SELECT count(*) FROM {{schema}}.dead_letters"); d != 0 {
		t.Fatalf("%d dead letters: an outage was counted as an attempt", d)
	}
	if w := b.q(t, "SELECT sum(next_offset) FROM {{schema}}.watermarks"); w != n {
		t.Fatalf("watermarks sum to %d, want %d", w, n)
	}
}
