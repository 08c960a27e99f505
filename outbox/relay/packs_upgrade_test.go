package relay

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
)

// Migration 015 applied to an outbox that already holds pending and parked rows (written
// before it): it keeps them, and this version's relay publishes them, in order, with the
// packs written after it; the parked row stays parked.
func TestPacksMigrationOnAnOutboxInUse(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	brokers := testenv.Brokers(t)
	schema := testenv.Schema(t, pool)
	ctx := context.Background()
	tn := tables.For(schema)
	if _, err := pool.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+tn.QuotedSchema); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+tn.Migrations+` (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
	for _, m := range migrations.All() {
		if m.Version >= 15 {
			break
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.SQL(schema)); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO `+tn.Migrations+` (version, name) VALUES ($1, $2)`, m.Version, m.Name)
			return err
		}); err != nil {
			t.Fatalf("migration %d: %v", m.Version, err)
		}
	}
	topic := testenv.Topic(t, brokers, 1)
	// Written before 015, as a previous version writes: plain rows, one of them parked.
	for i := 1; i <= 3; i++ {
		if _, err := pool.Exec(ctx, `INSERT INTO `+tn.Outbox+` (topic, key, value) VALUES ($1, 'k', $2)`, topic, fmt.Sprintf("k-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+tn.Outbox+` (topic, key, value, state, parked_at, last_error) VALUES ($1, 'p', 'parked', 'parked', now(), 'refused')`, topic); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Apply(ctx, pool, schema); err != nil {
		t.Fatalf("migrate up to 015 on an outbox in use: %v", err)
	}
	b := &testBundle{pool: pool, schema: schema, brokers: brokers, w: outbox.Writer{Schema: schema}, t: tn}
	b.writePacked(t, outbox.Record{Topic: topic, Key: []byte("k"), Value: []byte("k-4")}, outbox.Record{Topic: topic, Key: []byte("p"), Value: []byte("behind the parked one")})
	cfg := b.config(t)
	cfg.KeepPublished = 0
	b.start(t, cfg)
	waitCount(t, brokers, topic, 4, 60*time.Second)
	var got []string
	for _, m := range readAll(t, brokers, topic) {
		got = append(got, string(m.Value))
	}
	if fmt.Sprint(got) != "[k-1 k-2 k-3 k-4]" {
		t.Fatalf("published %v; want k-1 … k-4 in order (and nothing of key p)", got)
	}
	waitFor(t, 30*time.Second, "the pack moved out of the way", func() bool {
		open, _ := b.openRows(t)
		return open["parked"] == 1 && open["pending"] == 1 && len(open) == 2
	})
}
