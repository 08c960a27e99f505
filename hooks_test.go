package kafkatx

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// recordingHook implements every consumer hook and keeps what it saw.
type recordingHook struct {
	mu         sync.Mutex
	committed  []BatchCommitted
	retries    []RetryScheduled
	dead       []DeadLettered
	reconciled []PartitionReconciled
	assigned   []PartitionsAssigned
	revoked    []PartitionsRevoked
	fenced     []Fenced
	skipped    []OffsetsSkipped
	redelivery int
	lag        int
}

func (h *recordingHook) lock() func() { h.mu.Lock(); return h.mu.Unlock }

func (h *recordingHook) OnBatchCommitted(e BatchCommitted) {
	defer h.lock()()
	h.committed = append(h.committed, e)
}
func (h *recordingHook) OnRetryScheduled(e RetryScheduled) {
	defer h.lock()()
	h.retries = append(h.retries, e)
}
func (h *recordingHook) OnDeadLettered(e DeadLettered) { defer h.lock()(); h.dead = append(h.dead, e) }
func (h *recordingHook) OnPartitionReconciled(e PartitionReconciled) {
	defer h.lock()()
	h.reconciled = append(h.reconciled, e)
}
func (h *recordingHook) OnPartitionsAssigned(e PartitionsAssigned) {
	defer h.lock()()
	h.assigned = append(h.assigned, e)
}
func (h *recordingHook) OnPartitionsRevoked(e PartitionsRevoked) {
	defer h.lock()()
	h.revoked = append(h.revoked, e)
}
func (h *recordingHook) OnFenced(e Fenced) { defer h.lock()(); h.fenced = append(h.fenced, e) }
func (h *recordingHook) OnOffsetsSkipped(e OffsetsSkipped) {
	defer h.lock()()
	h.skipped = append(h.skipped, e)
}
func (h *recordingHook) OnRedeliveryDropped(e RedeliveryDropped) {
	defer h.lock()()
	h.redelivery += e.Count
}
func (h *recordingHook) OnPartitionLag(PartitionLag) { defer h.lock()(); h.lag++ }

// panickyHook panics on every batch: the loop must not notice.
type panickyHook struct{}

func (panickyHook) OnBatchCommitted(BatchCommitted) { panic("hook bug") }

// The hooks see the loop's events with the figures Stats and Prometheus report (the metrics
// are themselves a hook), and a panicking hook changes nothing.
func TestHooksSeeTheLoopsEvents(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	recs := values(40, 0, func(i int) string {
		switch i {
		case 7:
			return "bad"
		case 12:
			return "flaky"
		}
		return "ok"
	})
	recs = append(recs, values(10, 1, func(int) string { return "ok" })...)
	produce(t, b.brokers, b.topic, recs)
	h := &recordingHook{}
	cfg := b.config(t)
	cfg.Hooks = []Hook{panickyHook{}, h}
	cfg.Retry.MaxAttempts = 2
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	r := b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		switch string(m.Value) {
		case "bad":
			return Permanent(errors.New("bad order"))
		case "flaky":
			if m.Attempt == 1 {
				return errors.New("try again")
			}
		}
		return applyEffect(ctx, tx, b.schema, m)
	}, cfg)
	waitFor(t, 90*time.Second, "49 effects", func() bool { return b.q(t, "SELECT count(*) FROM {{schema}}.effects") == 49 })
	waitFor(t, 30*time.Second, "the watermarks at the ends", func() bool {
		return b.q(t, "SELECT coalesce(sum(next_offset), 0) FROM {{schema}}.watermarks WHERE group_id = $1", b.group) == 50
	})
	waitFor(t, 60*time.Second, "a lag tick", func() bool { defer h.lock()(); return h.lag > 0 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	s := r.c.Stats()
	defer h.lock()()
	var processed int
	covered := map[int32]int64{}
	for _, e := range h.committed {
		if e.Group != b.group || e.Topic != b.topic || e.NextOffset <= e.FirstOffset || e.Duration <= 0 {
			t.Fatalf("odd BatchCommitted %+v", e)
		}
		processed += e.Processed
		covered[e.Partition] = max(covered[e.Partition], e.NextOffset)
	}
	if int64(processed) != s.Processed || processed != 49 {
		t.Fatalf("BatchCommitted counts %d processed, Stats %d, want 49", processed, s.Processed)
	}
	if covered[0] != 40 || covered[1] != 10 {
		t.Fatalf("BatchCommitted reached %v, want 40 and 10", covered)
	}
	if len(h.dead) != 1 || h.dead[0].Offset != 7 || h.dead[0].ErrorClass != ErrorClassPermanent || h.dead[0].Partition != 0 || s.DeadLettered != 1 {
		t.Fatalf("DeadLettered %+v (Stats %d), want offset 7 permanent", h.dead, s.DeadLettered)
	}
	if len(h.retries) != 1 || h.retries[0].Offset != 12 || h.retries[0].Attempt != 1 || h.retries[0].ErrorClass != ErrorClassHandler ||
		h.retries[0].Backoff <= 0 || s.Retries != 1 {
		t.Fatalf("RetryScheduled %+v (Stats %d), want offset 12 after attempt 1", h.retries, s.Retries)
	}
	if len(h.reconciled) != 2 || len(h.assigned) == 0 {
		t.Fatalf("reconciled %+v, assigned %+v: want both partitions", h.reconciled, h.assigned)
	}
	var nAssigned int
	for _, a := range h.assigned {
		nAssigned += len(a.Partitions)
	}
	var revoked []PartitionOffset
	for _, e := range h.revoked {
		if e.Lost {
			t.Fatalf("a clean stop reported lost partitions: %+v", e)
		}
		revoked = append(revoked, e.Partitions...)
	}
	if nAssigned != 2 || len(revoked) != 2 {
		t.Fatalf("assigned %d, revoked %+v: want 2 and 2", nAssigned, revoked)
	}
	for _, p := range revoked {
		if want := map[int32]int64{0: 40, 1: 10}[p.Partition]; p.Offset != want {
			t.Fatalf("revoked %+v, want watermark %d", p, want)
		}
	}
	if h.lag == 0 {
		t.Fatal("no PartitionLag event")
	}
	if len(h.fenced) != 0 || len(h.skipped) != 0 {
		t.Fatalf("fenced %+v skipped %+v in a plain run", h.fenced, h.skipped)
	}
	// Prometheus, a hook like the others, agrees.
	for name, want := range map[string]float64{"processed": 49, "retries": 1} {
		vec := map[string]*prometheus.CounterVec{"processed": r.c.metrics.c.Processed, "retries": r.c.metrics.c.Retries}[name]
		if got := testutil.ToFloat64(vec.WithLabelValues(b.group, b.topic)); got != want {
			t.Fatalf("%s metric = %v, want %v", name, got, want)
		}
	}
	if n := testutil.CollectAndCount(r.c.metrics.c.BatchSeconds); n != 1 {
		t.Fatalf("batch duration histogram: %d series", n)
	}
}

// The events for offsets skipped by following Kafka and for a fenced worker.
func TestHooksSeeSkipsAndFences(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, values(10, 0, func(int) string { return "ok" }))
	h := &recordingHook{}
	cfg := b.config(t)
	cfg.Hooks = []Hook{h}
	handler := func(ctx context.Context, tx pgx.Tx, m *Message) error { return applyEffect(ctx, tx, b.schema, m) }
	r := b.start(t, handler, cfg)
	waitFor(t, 60*time.Second, "10 effects", func() bool { return b.q(t, "SELECT count(*) FROM {{schema}}.effects") == 10 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	// Kafka ahead of the database with nothing on record: an unexplained skip of [4, 10)... by
	// moving the database back to 4 behind the consumer's back.
	b.exec(t, "UPDATE {{schema}}.watermarks SET next_offset = 4 WHERE group_id = $1", b.group)
	r = b.start(t, handler, b.configWithHooks(t, h))
	waitFor(t, 60*time.Second, "the skip event", func() bool {
		defer h.lock()()
		return len(h.skipped) == 1
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	defer h.lock()()
	if e := h.skipped[0]; e.From != 4 || e.To != 10 || e.Kind != "unexplained_skip" || e.Partition != 0 {
		t.Fatalf("OffsetsSkipped %+v, want [4, 10) unexplained", e)
	}
	last := h.reconciled[len(h.reconciled)-1]
	if last.Drift != 0 || last.Start != 10 || last.Halted {
		t.Fatalf("PartitionReconciled %+v, want drift 0 after following Kafka to 10", last)
	}
}

func (b *testBundle) configWithHooks(t *testing.T, hooks ...Hook) *Config {
	cfg := b.config(t)
	cfg.Hooks = hooks
	return cfg
}

// A fenced watermark update (another owner moved it) is reported with both watermarks.
func TestHookFenced(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, values(3, 0, func(int) string { return "ok" }))
	h := &recordingHook{}
	moved := make(chan struct{})
	var once sync.Once
	r := b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if m.Offset == 1 {
			once.Do(func() {
				// Another owner commits past offset 2 while this transaction runs.
				b.exec(t, "UPDATE {{schema}}.watermarks SET next_offset = 3 WHERE group_id = $1", b.group)
				close(moved)
			})
		}
		return applyEffect(ctx, tx, b.schema, m)
	}, b.configWithBatch(t, 1, h))
	waitFor(t, 60*time.Second, "the fence", func() bool {
		defer h.lock()()
		return len(h.fenced) > 0
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	<-moved
	defer h.lock()()
	if e := h.fenced[0]; e.Expected != 1 || e.Watermark != 3 || e.Topic != b.topic {
		t.Fatalf("Fenced %+v, want expected 1, watermark 3", e)
	}
}

func (b *testBundle) configWithBatch(t *testing.T, size int, hooks ...Hook) *Config {
	cfg := b.configWithHooks(t, hooks...)
	cfg.Batch.Size = size
	return cfg
}

func TestNewConsumerRefusesAValueThatIsNoHook(t *testing.T) {
	type notAHook struct{}
	_, err := NewConsumer(nilPoolForValidation(t), func(context.Context, pgx.Tx, *Message) error { return nil },
		&Config{Kafka: kafka.ConfigMap{"bootstrap.servers": "127.0.0.1:1", "group.id": "g"}, Topics: []string{"t"}, Hooks: []Hook{&recordingHook{}, notAHook{}}})
	if err == nil || !strings.Contains(err.Error(), "Config.Hooks[1] (kafkatx.notAHook) implements none") {
		t.Fatalf("err = %v", err)
	}
}

// nilPoolForValidation is a pool that never connects (pgxpool connects lazily), for tests of
// NewConsumer's validation.
func nilPoolForValidation(t *testing.T) *pgxpool.Pool {
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}
