package relay

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap/zaptest"

	"github.com/kafkatx/kafkatx/dlq"
	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
)

// testBundle is what a relay test works with: a fresh migrated schema and the broker.
type testBundle struct {
	pool    *pgxpool.Pool
	schema  string
	brokers string
	w       outbox.Writer
	t       tables.Names
}

func setup(t testing.TB) *testBundle {
	t.Helper()
	pool := testenv.Postgres(t)
	brokers := testenv.Brokers(t)
	schema := testenv.Schema(t, pool)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := migrations.Apply(ctx, pool, schema); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return &testBundle{pool: pool, schema: schema, brokers: brokers, w: outbox.Writer{Schema: schema}, t: tables.For(schema)}
}

// config returns a relay config for the bundle with test-friendly intervals.
func (b *testBundle) config(t testing.TB) *Config {
	return &Config{
		Kafka:           kafka.ConfigMap{"bootstrap.servers": b.brokers},
		Schema:          b.schema,
		Logger:          zaptest.NewLogger(t),
		PollInterval:    500 * time.Millisecond,
		StandbyInterval: 200 * time.Millisecond,
		MetricsInterval: time.Second,
		ShutdownTimeout: 10 * time.Second,
		KeepPublished:   time.Hour, // tests read the published rows' state
	}
}

// start runs a relay until the test ends (or stop is called) and checks that Run returns nil.
func (b *testBundle) start(t testing.TB, cfg *Config) (*Relay, func()) {
	t.Helper()
	r, err := New(b.pool, cfg)
	if err != nil {
		t.Fatalf("relay.New: %v", err)
	}
	return r, b.run(t, r)
}

// run runs r until the test ends (or the returned stop is called) and checks that Run
// returns nil.
func (b *testBundle) run(t testing.TB, r *Relay) func() {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("relay.Run returned %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("relay.Run did not return within 30s of cancel")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// write writes records in one transaction and returns their row ids.
func (b *testBundle) write(t testing.TB, recs ...outbox.Record) []int64 {
	t.Helper()
	var ids []int64
	err := pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
		var err error
		ids, err = b.w.WriteTx(context.Background(), tx, recs...)
		return err
	})
	if err != nil {
		t.Fatalf("write outbox: %v", err)
	}
	return ids
}

// states returns the outbox rows' states by row id.
func (b *testBundle) states(t *testing.T) map[int64]string {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `SELECT id, state FROM `+b.t.Outbox)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64]string{}
	var id int64
	var st string
	_, err = pgx.ForEachRow(rows, []any{&id, &st}, func() error { out[id] = st; return nil })
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// outboxIDs returns the outbox_id of every row, by row id.
func (b *testBundle) outboxIDs(t *testing.T) map[int64]string {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `SELECT id, outbox_id::text FROM `+b.t.Outbox)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64]string{}
	var id int64
	var oid string
	_, err = pgx.ForEachRow(rows, []any{&id, &oid}, func() error { out[id] = oid; return nil })
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// waitFor polls cond every 50ms until it holds or timeout passes (testenv.WaitFor).
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	testenv.WaitFor(t, timeout, what, cond)
}

// topicCount returns the number of records in topic (sum of high minus low watermarks).
func topicCount(t testing.TB, brokers, topic string) int64 {
	t.Helper()
	c := newReader(t, brokers)
	defer c.Close()
	return countIn(t, c, topic)
}

func countIn(t testing.TB, c *kafka.Consumer, topic string) int64 {
	md, err := c.GetMetadata(&topic, false, 10000)
	if err != nil {
		t.Fatalf("metadata %s: %v", topic, err)
	}
	var n int64
	for _, p := range md.Topics[topic].Partitions {
		lo, hi, err := c.QueryWatermarkOffsets(topic, p.ID, 10000)
		if err != nil {
			t.Fatalf("watermarks %s[%d]: %v", topic, p.ID, err)
		}
		n += hi - lo
	}
	return n
}

// waitCount waits until topic holds at least n records.
func waitCount(t *testing.T, brokers, topic string, n int64, timeout time.Duration) {
	t.Helper()
	c := newReader(t, brokers)
	defer c.Close()
	waitFor(t, timeout, fmt.Sprintf("%d records in %s", n, topic), func() bool { return countIn(t, c, topic) >= n })
}

func newReader(t testing.TB, brokers string) *kafka.Consumer {
	t.Helper()
	c, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": brokers, "group.id": "kafkatx-test-reader",
		"enable.auto.commit": false, "go.logs.channel.enable": false})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// readAll returns every record of topic, up to the partitions' high watermarks at the time of
// the call, ordered by partition then offset.
func readAll(t *testing.T, brokers, topic string) []*kafka.Message {
	t.Helper()
	c := newReader(t, brokers)
	defer c.Close()
	md, err := c.GetMetadata(&topic, false, 10000)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int32]int64{}
	var tps []kafka.TopicPartition
	for _, p := range md.Topics[topic].Partitions {
		lo, hi, err := c.QueryWatermarkOffsets(topic, p.ID, 10000)
		if err != nil {
			t.Fatal(err)
		}
		if hi > lo {
			want[p.ID] = hi
			tps = append(tps, kafka.TopicPartition{Topic: &topic, Partition: p.ID, Offset: kafka.Offset(lo)})
		}
	}
	if len(tps) == 0 {
		return nil
	}
	if err := c.Assign(tps); err != nil {
		t.Fatal(err)
	}
	var out []*kafka.Message
	deadline := time.Now().Add(60 * time.Second)
	for len(want) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("reading %s: partitions %v not read to their end", topic, want)
		}
		m, err := c.ReadMessage(time.Second)
		if err != nil {
			var ke kafka.Error
			if errors.As(err, &ke) && ke.IsTimeout() {
				continue
			}
			t.Fatalf("reading %s: %v", topic, err)
		}
		out = append(out, m)
		if int64(m.TopicPartition.Offset)+1 >= want[m.TopicPartition.Partition] {
			delete(want, m.TopicPartition.Partition)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i].TopicPartition, out[j].TopicPartition
		if a.Partition != b.Partition {
			return a.Partition < b.Partition
		}
		return a.Offset < b.Offset
	})
	return out
}

// header returns the value of the last header named key, and whether there was one.
func header(m *kafka.Message, key string) (string, bool) {
	v, ok := "", false
	for _, h := range m.Headers {
		if h.Key == key {
			v, ok = string(h.Value), true
		}
	}
	return v, ok
}

// deadLetterFixture is a dead letter with a nil key, binary value and headers, one of them an
// original kafkatx-outbox-id.
func deadLetterFixture(topic string) *dlq.DeadLetter {
	now := time.Now()
	return &dlq.DeadLetter{Group: "g", Topic: topic, Partition: 2, Offset: 41, Key: nil,
		Value:     []byte("malformed\x00\xff"),
		Headers:   []dlq.Header{{Key: "trace", Value: []byte{0, 1}}, {Key: outbox.HeaderOutboxID, Value: []byte("original-id")}},
		Timestamp: now.Add(-time.Minute), ErrorClass: "permanent", ErrorMessage: "bad json", Attempts: 5,
		FirstFailureAt: now.Add(-time.Minute), LastFailureAt: now}
}

func insertDeadLetter(ctx context.Context, tx pgx.Tx, schema string, d *dlq.DeadLetter) (int64, bool, error) {
	return dlq.InsertTx(ctx, tx, schema, d)
}
