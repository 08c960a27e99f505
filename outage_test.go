package kafkatx

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kafkatx/kafkatx/pgstart"
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
	// A ceiling that only catches a hang: alone it drains in about 10 s; on a loaded machine,
	// under -race, several times that.
	r.waitFor(t, 5*time.Minute, "every message applied", func() bool {
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

// Issue 43: on a loaded machine the outage test's first cut came while Run still applied its
// migrations, and Run returned the refused connection at once — the consumer was gone and the
// test waited 120 s for a drain that could not happen. Run's first step now waits for a
// database that is not ready (pgstart.Retry, bounded by pgstart.Within) as the loop rides out
// an outage once it runs. Here the database refuses connections before Run starts: Run logs
// the wait, keeps waiting, and drains the backlog once connections are allowed again.
func TestRunWaitsForADatabaseThatRefusesConnectionsAtStart(t *testing.T) {
	t.Parallel()
	b, admin, dbName := setupOwnDatabase(t, "kafkatx_start_outage", 1)
	ctx := context.Background()
	const n = 20
	produce(t, b.brokers, b.topic, values(n, 0, func(i int) string { return fmt.Sprint(i) }))
	allow := func(on bool) {
		t.Helper()
		if _, err := admin.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s ALLOW_CONNECTIONS %t", pgx.Identifier{dbName}.Sanitize(), on)); err != nil {
			t.Fatal(err)
		}
	}
	allow(false)
	t.Cleanup(func() { allow(true) })
	if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid() AND backend_type = 'client backend'", dbName); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.WarnLevel)
	cfg := b.config(t)
	cfg.Logger = zap.New(zapcore.NewTee(cfg.Logger.Core(), core))
	cfg.Retry.MaxAttempts = 1
	r := b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error { return applyEffect(ctx, tx, b.schema, m) }, cfg)
	r.waitFor(t, 60*time.Second, "Run to wait for the database at its start", func() bool {
		return logs.FilterMessage("database not ready at start; waiting for it (bounded)").Len() > 0
	})
	// The refusal a new connection meets now is one the wait covers: 55000 at connect.
	if conn, err := pgx.Connect(ctx, b.dbURL); err == nil {
		conn.Close(ctx)
		t.Fatal("connected to a database that does not allow connections")
	} else if cond, ok := pgstart.NotYet(err); !ok || cond != "55000 database_not_accepting_connections" {
		t.Fatalf("pgstart.NotYet(%v) = %q, %t; want 55000 database_not_accepting_connections, true", err, cond, ok)
	}
	allow(true)
	r.waitFor(t, 5*time.Minute, "every message applied", func() bool {
		var c int64
		return b.pool.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM %s", pgx.Identifier{b.schema, "effects"}.Sanitize())).Scan(&c) == nil && c == n
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if d := b.q(t, "SELECT count(*) FROM {{schema}}.dead_letters"); d != 0 {
		t.Fatalf("%d dead letters after the wait at start", d)
	}
}
