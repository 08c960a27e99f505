package kafkatx

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain())
	}
	if mode := os.Getenv(liveChildEnv); mode != "" {
		os.Exit(liveChildMain(mode))
	}
	if os.Getenv(kip848ChildEnv) != "" {
		os.Exit(kip848ChildMain())
	}
	// Every goroutine the consumer starts is owned by Run and gone when it returns — but one:
	// librdkafka never finishes closing a client fenced as a static member, so the close that
	// engine.closeWithin leaves running past Config.CloseTimeout (after a rejoin, rejoin.go)
	// stays until the process exits. A known limit (docs/consumer.md, "Static membership"),
	// seen only in the broker-kill tests; every other goroutine is still checked. The same
	// for a synchronous offset commit sent to a frozen broker (the broker-freeze tests):
	// librdkafka may never answer it, even once the client is closed; client.close and
	// committer.flush go on without it after their bounds (rejoin.go, committer.go).
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/kafkatx/kafkatx/internal/engine.closeWithin.func1"),
		goleak.IgnoreAnyFunction("github.com/confluentinc/confluent-kafka-go/v2/kafka.(*Consumer).CommitOffsets"))
}

// testBundle is one test's world: a fresh schema, a fresh topic and group on the real
// broker.
type testBundle struct {
	pool    *pgxpool.Pool
	dbURL   string
	schema  string
	brokers string
	topic   string
	group   string
}

func setup(t *testing.T, partitions int) *testBundle {
	t.Helper()
	pool := testenv.Postgres(t)
	b := &testBundle{
		pool:    pool,
		dbURL:   os.Getenv("DATABASE_URL"),
		schema:  testenv.Schema(t, pool),
		brokers: testenv.Brokers(t),
	}
	b.topic = testenv.Topic(t, b.brokers, partitions)
	b.group = "g-" + b.topic
	b.migrateWithEffects(t)
	return b
}

// migrateWithEffects applies kafkatx's migrations to b.schema and creates the test handlers'
// effects table there.
func (b *testBundle) migrateWithEffects(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	if err := Migrate(ctx, b.pool, b.schema); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (topic text, partition int, "offset" bigint, value bytea, applied int NOT NULL, seq bigserial,
		PRIMARY KEY (topic, partition, "offset"))`, pgx.Identifier{b.schema, "effects"}.Sanitize())); err != nil {
		t.Fatal(err)
	}
}

// setupOwnDatabase is setup on a database of the test's own (testenv.Database), for tests
// that break the database itself (terminate its sessions, make it read-only): it returns the
// bundle, a pool on the shared dev database to act on it from outside, and its name.
func setupOwnDatabase(t *testing.T, schema string, partitions int) (b *testBundle, admin *pgxpool.Pool, dbName string) {
	t.Helper()
	url := testenv.Database(t)
	dbName = url[strings.LastIndex(url, "/")+1:]
	if i := strings.IndexByte(dbName, '?'); i >= 0 {
		dbName = dbName[:i]
	}
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	admin = testenv.Postgres(t)
	b = &testBundle{pool: pool, dbURL: url, schema: schema, brokers: testenv.Brokers(t)}
	b.topic = testenv.Topic(t, b.brokers, partitions)
	b.group = "g-" + b.topic
	b.migrateWithEffects(t)
	return b, admin, dbName
}

// applyEffect is the test handlers' effect: a row per message counting its applications,
// so a duplicate effect shows as applied = 2.
func applyEffect(ctx context.Context, tx pgx.Tx, schema string, m *Message) error {
	_, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (topic, partition, "offset", value, applied) VALUES ($1, $2, $3, $4, 1)
		ON CONFLICT (topic, partition, "offset") DO UPDATE SET applied = effects.applied + 1`, pgx.Identifier{schema, "effects"}.Sanitize()),
		m.Topic, m.Partition, m.Offset, m.Value)
	return err
}

type testRecord struct {
	key, value []byte
	headers    []kafka.Header
	partition  int32 // -1: any
}

func produce(t *testing.T, brokers, topic string, recs []testRecord) {
	t.Helper()
	p, err := kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": brokers, "enable.idempotence": true, "acks": "all", "linger.ms": 5})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ch := make(chan kafka.Event, len(recs))
	for _, r := range recs {
		part := r.partition
		if part < 0 {
			part = kafka.PartitionAny
		}
		if err := p.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: part}, Key: r.key, Value: r.value, Headers: r.headers}, ch); err != nil {
			t.Fatal(err)
		}
	}
	for range recs {
		e := <-ch
		if m := e.(*kafka.Message); m.TopicPartition.Error != nil {
			t.Fatal(m.TopicPartition.Error)
		}
	}
}

func values(n int, partition int32, f func(i int) string) []testRecord {
	out := make([]testRecord, n)
	for i := range out {
		out[i] = testRecord{key: []byte(fmt.Sprintf("k%d", i)), value: []byte(f(i)), partition: partition}
	}
	return out
}

func (b *testBundle) config(t *testing.T) *Config {
	return &Config{
		Kafka:  kafka.ConfigMap{"bootstrap.servers": b.brokers, "group.id": b.group, "session.timeout.ms": 6000, "heartbeat.interval.ms": 500},
		Topics: []string{b.topic},
		Schema: b.schema,
		Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)),
		Retry:  RetryPolicy{InitialBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond},
	}
}

type running struct {
	c      *Consumer
	cancel context.CancelFunc
	done   chan error
}

func (b *testBundle) start(t *testing.T, h Handler, cfg *Config) *running {
	t.Helper()
	c, err := NewConsumer(b.pool, h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return run(t, c)
}

// run runs c until the test ends or stop is called.
func run(t *testing.T, c *Consumer) *running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{c: c, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

func (r *running) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	select {
	case err, ok := <-r.done:
		if ok {
			close(r.done)
		}
		return err
	case <-time.After(60 * time.Second):
		t.Fatal("consumer did not stop within 60s")
		return nil
	}
}

// waitFor is waitFor while the consumer runs: it fails at once, with Run's result, when Run
// returns before cond holds — a consumer that ended early is not waited for until the
// timeout (a Run that gave up on a database outage at its start once looked like a slow
// drain for 120 s).
func (r *running) waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	testenv.WaitFor(t, timeout, what, func() bool {
		select {
		case err, ok := <-r.done:
			if ok {
				r.done <- err // stop still reads it
			}
			t.Fatalf("Run returned (%v) while waiting for %s", err, what)
		default:
		}
		return cond()
	})
}

// exec runs a statement, with {{schema}} replaced as in q.
func (b *testBundle) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	sql = strings.ReplaceAll(sql, "{{schema}}", pgx.Identifier{b.schema}.Sanitize())
	if _, err := b.pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func (b *testBundle) q(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	sql = strings.ReplaceAll(sql, "{{schema}}", pgx.Identifier{b.schema}.Sanitize())
	var n int64
	if err := b.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	testenv.WaitFor(t, timeout, what, cond)
}

// waitForThen is waitFor, naming detail() — evaluated at the deadline — when it times out.
func waitForThen(t *testing.T, timeout time.Duration, what string, cond func() bool, detail func() string) {
	t.Helper()
	testenv.WaitFor(t, timeout, what, cond, detail)
}

// committedOffsets returns the group's committed offsets per partition of the topic.
func (b *testBundle) committedOffsets(t *testing.T, partitions int) map[int32]int64 {
	t.Helper()
	c, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": b.brokers, "group.id": b.group})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var tps []kafka.TopicPartition
	for p := 0; p < partitions; p++ {
		tps = append(tps, kafka.TopicPartition{Topic: &b.topic, Partition: int32(p)})
	}
	got, err := c.Committed(tps, 10000)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int32]int64{}
	for _, tp := range got {
		out[tp.Partition] = int64(tp.Offset)
	}
	return out
}

// requireServices stops a parent test (see testenv.Unavailable) before it starts subtests that
// need PostgreSQL and Kafka, so that a run without them reports the parent as skipped too, not
// as a pass made of skipped subtests.
func requireServices(t *testing.T) {
	t.Helper()
	testenv.Postgres(t)
	testenv.Brokers(t)
}
