package kafkatx

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
	"github.com/kafkatx/kafkatx/outbox/leading"
	"github.com/kafkatx/kafkatx/outbox/relay"
	"github.com/kafkatx/kafkatx/outbox/walrelay"
	"github.com/kafkatx/kafkatx/shards"
)

// Issue 46: a shard whose relay runs nowhere is an alert, in both outbox modes. Two
// databases as shards, both with an event waiting; a real relay runs on s1 only (table mode:
// its leadership is the advisory lock and rows wait; WAL mode: its slot active, and WAL the
// slot has not confirmed waits, leading.Of). The consumer's watch finds s2 relayed by nobody
// once its event has waited ShardUnrelayedAfter (not before): the gauge
// kafkatx_shard_relay_unowned{shard="s2"} is 1, s1's 0, and Readiness.Notes names s2 and not
// s1. A relay started on s2 clears both.
func TestShardRelaysNamesAShardRelayedByNobody(t *testing.T) {
	for _, mode := range []outbox.Mode{outbox.ModeTable, outbox.ModeWAL} {
		t.Run(string(mode), func(t *testing.T) { shardRelayedByNobody(t, mode) })
	}
}

func shardRelayedByNobody(t *testing.T, mode outbox.Mode) {
	b := setup(t, 1)
	ctx := context.Background()
	s1, s2 := shardPool(t, b.schema), shardPool(t, b.schema)
	for _, p := range []*pgxpool.Pool{s1, s2} {
		if mode == outbox.ModeWAL {
			t.Cleanup(func() {
				_, _ = p.Exec(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database() AND NOT active`)
			})
			if err := outbox.SetMode(ctx, p, b.schema, outbox.ModeWAL); err != nil {
				t.Fatal(err)
			}
		}
		if err := pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error {
			_, err := outbox.Writer{Schema: b.schema}.WriteTx(ctx, tx, outbox.Record{Topic: b.topic, Value: []byte("v")})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	var checkpoints string
	if mode == outbox.ModeWAL {
		checkpoints = testenv.TopicWithConfig(t, b.brokers, 1, map[string]string{"cleanup.policy": "compact"})
	}
	startRelay := func(name string, p *pgxpool.Pool) {
		t.Helper()
		var run func(context.Context) error
		if mode == outbox.ModeWAL {
			r, err := walrelay.New(p, walrelay.Config{Kafka: kafka.ConfigMap{"bootstrap.servers": b.brokers}, Schema: b.schema,
				Replication: p.Config().ConnConfig, CheckpointTopic: checkpoints, TransactionalIDPrefix: "kafkatx-wal-" + name + "-"})
			if err != nil {
				t.Fatal(err)
			}
			run = r.Run
		} else {
			r, err := relay.New(p, &relay.Config{Kafka: kafka.ConfigMap{"bootstrap.servers": b.brokers}, Schema: b.schema, StandbyInterval: 100 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			run = r.Run
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = run(rctx) }()
		t.Cleanup(func() { cancel(); <-done })
		testenv.WaitFor(t, 60*time.Second, "the relay on "+name+" leading", func() bool {
			leader, _, err := leading.Of(ctx, p, b.schema)
			if err != nil {
				t.Fatal(err)
			}
			return leader
		})
	}
	startRelay("s1", s1)
	if leader, pending, err := leading.Of(ctx, s2, b.schema); err != nil || leader || !pending {
		t.Fatalf("s2 before its relay: leader %v, pending %v, %v; want no leader and an event waiting", leader, pending, err)
	}

	cfg := b.config(t)
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	cfg.Shards = &shards.Set{Directory: b.pool, Shards: []shards.Shard{{Name: "s1", Pool: s1}, {Name: "s2", Pool: s2}}}
	c, err := NewConsumer(b.pool, func(context.Context, pgx.Tx, *Message) error { return nil }, cfg)
	if err != nil {
		t.Fatal(err)
	}
	gauge := func(shard string) float64 {
		return testutil.ToFloat64(c.metrics.c.ShardRelayUnowned.WithLabelValues(shard))
	}
	w := c.relays
	t0 := time.Now()
	w.check(ctx, t0)
	w.check(ctx, t0.Add(ShardUnrelayedAfter-time.Second))
	if gauge("s1") != 0 || gauge("s2") != 0 || w.noteAt(t0.Add(ShardUnrelayedAfter-time.Second)) != "" {
		t.Fatalf("within the bound: s1 %v, s2 %v, note %q; want 0, 0, none", gauge("s1"), gauge("s2"), w.noteAt(t0.Add(ShardUnrelayedAfter-time.Second)))
	}
	late := t0.Add(ShardUnrelayedAfter + time.Second)
	w.check(ctx, late)
	if gauge("s1") != 0 || gauge("s2") != 1 {
		t.Fatalf("past the bound: s1 %v, s2 %v; want 0, 1", gauge("s1"), gauge("s2"))
	}
	wantNote := "shard s2: "
	if mode == outbox.ModeTable {
		wantNote = "shard s2: outbox rows have waited since"
	}
	if n := w.noteAt(late); !strings.Contains(n, wantNote) || strings.Contains(n, "shard s1") {
		t.Fatalf("note %q", n)
	}
	// Through Readiness (real clock): the same watch, backdated, shows as a note named
	// "shard relays".
	w.mu.Lock()
	w.since["s2"] = time.Now().Add(-2 * ShardUnrelayedAfter)
	w.mu.Unlock()
	var found bool
	for _, n := range c.Readiness(ctx).Notes {
		found = found || n.Name == "shard relays" && strings.Contains(n.Note, "shard s2")
	}
	if !found {
		t.Fatalf("Readiness.Notes %+v do not name shard s2", c.Readiness(ctx).Notes)
	}

	startRelay("s2", s2)
	w.check(ctx, late.Add(time.Minute))
	if gauge("s2") != 0 || w.noteAt(late.Add(time.Minute)) != "" {
		t.Fatalf("with a relay on s2: gauge %v, note %q", gauge("s2"), w.noteAt(late.Add(time.Minute)))
	}
}
