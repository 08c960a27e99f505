package kafkatx

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
	"github.com/kafkatx/kafkatx/outbox/relay"
	"github.com/kafkatx/kafkatx/shards"
)

// startShardRelay runs a table relay on pool until the test ends.
func startShardRelay(t *testing.T, b *testBundle, pool *pgxpool.Pool) {
	t.Helper()
	r, err := relay.New(pool, &relay.Config{Kafka: kafka.ConfigMap{"bootstrap.servers": b.brokers}, Schema: b.schema, StandbyInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// Issue 46: a key's events keep their order on the topic across a move under load. The
// handler writes one outbox record per message, all under one key; s1's relay is not running
// when the move starts, so its outbox still holds the partition's first 100 events, while
// the next 100 arrive and s2's relay runs. s1's relay starts once s2's outbox holds a row of
// the partition (or after 4 s). The cut-over waits for s1's outbox to drain (before it, the
// move finished at once and s2's relay published events 100.. before s1's published 0..99):
// the topic holds 0..199 in order, each once, and every message was applied once.
func TestShardsMoveKeepsAKeysOrderOnTheTopic(t *testing.T) {
	b := setup(t, 1)
	ctx := context.Background()
	s1, s2 := shardPool(t, b.schema), shardPool(t, b.schema)
	set := &shards.Set{Directory: b.pool, Shards: []shards.Shard{{Name: "s1", Pool: s1}, {Name: "s2", Pool: s2}}}
	out := testenv.Topic(t, b.brokers, 1)
	h := Handler(func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if err := applyEffect(ctx, tx, b.schema, m); err != nil {
			return err
		}
		_, err := outbox.Writer{Schema: b.schema}.WriteTx(ctx, tx, outbox.Record{Topic: out, Key: []byte("k"), Value: m.Value})
		return err
	})
	seq := func(from, n int) []testRecord {
		recs := make([]testRecord, n)
		for i := range recs {
			recs[i] = testRecord{key: []byte("k"), value: []byte(fmt.Sprintf("%04d", from+i)), partition: 0}
		}
		return recs
	}
	count := func(pool *pgxpool.Pool, table string) int64 {
		var n int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{b.schema, table}.Sanitize()).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	startShardRelay(t, b, s2)
	cfg := b.config(t)
	cfg.Shards = set
	cfg.Batch.Size = 10
	r := b.start(t, h, cfg)
	produce(t, b.brokers, b.topic, seq(0, 100))
	r.waitFor(t, 60*time.Second, "100 events in s1's outbox", func() bool { return count(s1, "outbox") >= 100 })

	type result struct {
		e   shards.Entry
		err error
	}
	moved := make(chan result, 1)
	var movedAt atomic.Int64
	go func() {
		e, err := shards.Move(ctx, set, b.schema, shards.MoveOptions{Group: b.group, Topic: b.topic, Partition: 0, To: "s2",
			Reason: "test: order across the move", Hook: moveEffects(b.schema), DrainWithin: 90 * time.Second})
		movedAt.Store(time.Now().UnixNano())
		moved <- result{e, err}
	}()
	produced := make(chan struct{})
	go func() { defer close(produced); produce(t, b.brokers, b.topic, seq(100, 100)) }()
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) && count(s2, "outbox") == 0 {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second) // s2's relay publishes what it holds
	relayedAt := time.Now().UnixNano()
	startShardRelay(t, b, s1)
	<-produced
	res := <-moved
	if res.err != nil || res.e.Shard != "s2" || res.e.Epoch != 2 {
		t.Fatalf("move: %+v, %v", res.e, res.err)
	}
	if movedAt.Load() < relayedAt {
		t.Errorf("the move finished %s before s1's relay started: its cut-over did not wait for s1's outbox", time.Duration(relayedAt-movedAt.Load()))
	}
	r.waitFor(t, 90*time.Second, "200 messages applied", func() bool { return count(s1, "effects")+count(s2, "effects") >= 200 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	got := testenv.Read(t, b.brokers, out, 200)
	for i, m := range got {
		if want := fmt.Sprintf("%04d", i); string(m.Value) != want {
			t.Fatalf("record %d on %s is event %s, want %s: the key's events are out of order across the move", i, out, m.Value, want)
		}
	}
}

// moveEffects is a shards.MoveHook moving the test handlers' effects rows of a partition.
func moveEffects(schema string) shards.MoveHook {
	effects := pgx.Identifier{schema, "effects"}.Sanitize()
	return func(ctx context.Context, from, to pgx.Tx, group, topic string, partition int32) error {
		if _, err := to.Exec(ctx, `DELETE FROM `+effects+` WHERE topic = $1 AND partition = $2`, topic, partition); err != nil {
			return err
		}
		rows, err := from.Query(ctx, `DELETE FROM `+effects+` WHERE topic = $1 AND partition = $2 RETURNING topic, partition, "offset", value, applied`, topic, partition)
		if err != nil {
			return err
		}
		data, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([]any, error) { return r.Values() })
		if err != nil {
			return err
		}
		_, err = to.CopyFrom(ctx, pgx.Identifier{schema, "effects"}, []string{"topic", "partition", "offset", "value", "applied"}, pgx.CopyFromRows(data))
		return err
	}
}
