package kafkatx

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

// TestSkipMigrationsChecksInsteadOfApplying: with Config.SkipMigrations a consumer whose role
// could not create tables never tries to; on an unmigrated schema Run says which versions are
// missing and creates nothing, and once they are applied it runs.
func TestSkipMigrationsChecksInsteadOfApplying(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	brokers := testenv.Brokers(t)
	cfg := &Config{
		Kafka:          kafka.ConfigMap{"bootstrap.servers": brokers, "group.id": "g-" + schema},
		Topics:         []string{"t-" + schema},
		Schema:         schema,
		SkipMigrations: true,
	}
	c, err := NewConsumer(pool, func(context.Context, pgx.Tx, *Message) error { return nil }, cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = c.Run(context.Background())
	var me *MigrationsMissingError
	if !errors.As(err, &me) || len(me.Missing) != len(migrations.All()) || me.Schema != schema {
		t.Fatalf("Run on an unmigrated schema = %v; want *MigrationsMissingError naming all %d versions", err, len(migrations.All()))
	}
	var tables int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_tables WHERE schemaname = $1`, schema).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Fatalf("Run with SkipMigrations created %d tables", tables)
	}

	if err := Migrate(context.Background(), pool, schema); err != nil {
		t.Fatal(err)
	}
	c, err = NewConsumer(pool, func(context.Context, pgx.Tx, *Message) error { return nil }, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Past the check Run runs (its poll loop started); stopped then, it returns nil.
	r := run(t, c)
	r.waitFor(t, 60*time.Second, "Run past the migrations check", func() bool { return c.loop.Health().Running })
	if err := r.stop(t); err != nil {
		t.Fatalf("Run on a migrated schema with SkipMigrations: %v", err)
	}
}

// TestRegistererRefusalIsReturned: a registry that already holds a kafkatx metric name with
// other labels refuses ours; NewConsumer says so instead of running without metrics. Two
// consumers on one registry share the collectors.
func TestRegistererRefusalIsReturned(t *testing.T) {
	reg := prometheus.NewRegistry()
	cfg := func() *Config {
		return &Config{Kafka: kafka.ConfigMap{"bootstrap.servers": "127.0.0.1:1", "group.id": "g"}, Topics: []string{"t"}, Registerer: reg}
	}
	h := func(context.Context, pgx.Tx, *Message) error { return nil }
	// NewConsumer connects nothing: a pool that would never reach a server is enough.
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := NewConsumer(pool, h, cfg()); err != nil {
		t.Fatal(err)
	}
	if _, err := NewConsumer(pool, h, cfg()); err != nil {
		t.Fatalf("a second consumer on the same registry: %v; want the collectors shared", err)
	}
	other := prometheus.NewRegistry()
	other.MustRegister(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kafkatx_messages_processed_total", Help: "someone else's"}, []string{"app"}))
	c := cfg()
	c.Registerer = other
	if _, err := NewConsumer(pool, h, c); err == nil {
		t.Fatal("NewConsumer accepted a registry that refuses kafkatx_messages_processed_total")
	} else {
		t.Log(fmt.Sprint(err))
	}
}
