package kafkatx

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestConsumerAppliesEachMessageOnceAndCommitsAfterTheDatabase(t *testing.T) {
	t.Parallel()
	b := setup(t, 3)
	produce(t, b.brokers, b.topic, values(300, -1, func(i int) string { return fmt.Sprintf(`{"n":%d}`, i) }))
	cfg := b.config(t)
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	r := b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error { return applyEffect(ctx, tx, b.schema, m) }, cfg)
	waitFor(t, 60*time.Second, "300 effects", func() bool { return b.q(t, "SELECT count(*) FROM {{schema}}.effects") == 300 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.effects WHERE applied <> 1"); n != 0 {
		t.Fatalf("%d messages applied more than once", n)
	}
	if w := b.q(t, "SELECT sum(next_offset) FROM {{schema}}.watermarks WHERE group_id = $1", b.group); w != 300 {
		t.Fatalf("watermarks sum to %d, want 300", w)
	}
	var sum int64
	for _, off := range b.committedOffsets(t, 3) {
		sum += off
	}
	if sum != 300 {
		t.Fatalf("Kafka committed offsets sum to %d, want 300", sum)
	}
	if s := r.c.Stats(); s.Processed != 300 || s.DeadLettered != 0 {
		t.Fatalf("stats %+v", s)
	}
	// The same figures for Prometheus: processed, and a drift gauge per assigned partition.
	if got := testutil.ToFloat64(r.c.metrics.c.Processed.WithLabelValues(b.group, b.topic)); got != 300 {
		t.Fatalf("kafkatx_messages_processed_total = %v, want 300", got)
	}
	if n, err := testutil.GatherAndCount(reg, "kafkatx_offset_drift"); err != nil || n != 3 {
		t.Fatalf("kafkatx_offset_drift series: %d (%v), want one per partition (3)", n, err)
	}
}

// strictJSON is a handler that applies valid JSON and rejects anything else permanently,
// quoting the bad bytes in its error (the dead-letter write must survive them).
func strictJSON(schema string) Handler {
	return func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if string(m.Value) == "panic" {
			panic("handler panic on purpose")
		}
		if !json.Valid(m.Value) {
			return Permanent(fmt.Errorf("not JSON: %q %s", m.Value, m.Value))
		}
		return applyEffect(ctx, tx, schema, m)
	}
}

func TestBadInputIsDeadLetteredWithAReasonAndThePartitionFlows(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	big := bytes.Repeat([]byte("x"), 5000)
	recs := []testRecord{
		{key: []byte("a"), value: []byte(`{"ok":1}`)},
		{key: nil, value: []byte("nil key, not json\x00with NUL")},
		{key: []byte{0xff, 0x00, 0xfe}, value: []byte{0xff, 0xfe, 0x00, 0x80, 'x'}},
		{key: []byte("b"), value: []byte(`{"ok":2}`), headers: []kafka.Header{{Key: "bin", Value: []byte{0, 1, 2, 0xff}}, {Key: "null", Value: nil}}},
		{key: []byte("c"), value: big},
		{key: []byte("d"), value: []byte("panic")},
		{key: []byte("e"), value: []byte(`{"ok":3}`)},
	}
	produce(t, b.brokers, b.topic, recs)
	cfg := b.config(t)
	cfg.MaxValueBytes = 1000
	cfg.Retry.MaxAttempts = 2
	b.start(t, strictJSON(b.schema), cfg)
	waitFor(t, 60*time.Second, "the watermark past every message", func() bool {
		return b.q(t, "SELECT coalesce(max(next_offset), 0) FROM {{schema}}.watermarks") == int64(len(recs))
	})
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.effects WHERE applied = 1"); n != 3 {
		t.Fatalf("%d valid messages applied, want 3", n)
	}
	rows, err := b.pool.Query(context.Background(), fmt.Sprintf(`SELECT "offset", key, value, error_class, error_message, attempts, header_keys, header_values, coalesce(stack, '')
		FROM %s ORDER BY "offset"`, pgx.Identifier{b.schema, "dead_letters"}.Sanitize()))
	if err != nil {
		t.Fatal(err)
	}
	type dl struct {
		off        int64
		key, value []byte
		class, msg string
		attempts   int
		hk         [][]byte
		hv         [][]byte
		stack      string
	}
	var got []dl
	for rows.Next() {
		var d dl
		if err := rows.Scan(&d.off, &d.key, &d.value, &d.class, &d.msg, &d.attempts, &d.hk, &d.hv, &d.stack); err != nil {
			t.Fatal(err)
		}
		got = append(got, d)
	}
	if len(got) != 4 {
		t.Fatalf("%d dead letters, want 4: %+v", len(got), got)
	}
	for i, want := range []struct {
		off   int64
		class string
	}{{1, ErrorClassPermanent}, {2, ErrorClassPermanent}, {4, ErrorClassOversized}, {5, ErrorClassPanic}} {
		d := got[i]
		if d.off != want.off || d.class != want.class {
			t.Fatalf("dead letter %d: offset %d class %s, want %d %s", i, d.off, d.class, want.off, want.class)
		}
		if !bytes.Equal(d.value, recs[d.off].value) {
			t.Fatalf("offset %d: value not kept byte for byte: %q", d.off, d.value)
		}
		if (d.key == nil) != (recs[d.off].key == nil) || !bytes.Equal(d.key, recs[d.off].key) {
			t.Fatalf("offset %d: key %q, want %q", d.off, d.key, recs[d.off].key)
		}
		if d.msg == "" || strings.ContainsRune(d.msg, 0) {
			t.Fatalf("offset %d: error message %q", d.off, d.msg)
		}
	}
	if got[3].attempts != 2 || !strings.Contains(got[3].stack, "panic") {
		t.Fatalf("panic dead letter: attempts %d (want 2), stack %q", got[3].attempts, got[3].stack)
	}
	if got[2].attempts != 0 {
		t.Fatalf("oversized value ran the handler: attempts %d", got[2].attempts)
	}
}

func TestRetryableDatabaseErrorsAreNotAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, values(10, 0, func(i int) string { return fmt.Sprint(i) }))
	var deadlocks atomic.Int32
	var attemptSeen atomic.Int32
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if m.Offset == 3 {
			if deadlocks.Add(1) <= 3 {
				return fmt.Errorf("update: %w", &pgconn.PgError{Code: "40P01", Message: "deadlock detected"})
			}
			attemptSeen.Store(int32(m.Attempt))
		}
		return applyEffect(ctx, tx, b.schema, m)
	}
	cfg := b.config(t)
	cfg.Retry.MaxAttempts = 2
	b.start(t, h, cfg)
	waitFor(t, 60*time.Second, "10 effects", func() bool { return b.q(t, "SELECT count(*) FROM {{schema}}.effects") == 10 })
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.dead_letters"); n != 0 {
		t.Fatalf("a deadlock was counted as an attempt: %d dead letters", n)
	}
	if a := attemptSeen.Load(); a != 1 {
		t.Fatalf("the message ran as attempt %d after deadlocks, want 1", a)
	}
}

func TestFailingMessageIsRetriedThenDeadLetteredAloneInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, values(20, 0, func(i int) string { return fmt.Sprint(i) }))
	var mu sync.Mutex
	runs := map[int64]int{}
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		mu.Lock()
		runs[m.Offset]++
		mu.Unlock()
		if m.Offset == 7 {
			return errors.New("downstream says no")
		}
		return applyEffect(ctx, tx, b.schema, m)
	}
	cfg := b.config(t)
	cfg.Retry.MaxAttempts = 3
	b.start(t, h, cfg)
	waitFor(t, 60*time.Second, "watermark 20", func() bool {
		return b.q(t, "SELECT coalesce(max(next_offset), 0) FROM {{schema}}.watermarks") == 20
	})
	mu.Lock()
	defer mu.Unlock()
	if runs[7] != 3 {
		t.Fatalf("failing message ran %d times, want 3 (max attempts)", runs[7])
	}
	if n := b.q(t, `SELECT attempts FROM {{schema}}.dead_letters WHERE "offset" = 7`); n != 3 {
		t.Fatalf("dead letter attempts %d", n)
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.effects WHERE applied <> 1"); n != 0 {
		t.Fatalf("%d duplicate effects", n)
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.attempts"); n != 0 {
		t.Fatalf("%d attempt rows left behind", n)
	}
	// Invariant 5: effects committed in offset order (the dead letter in between): the
	// effects' sequence numbers grow with their offsets.
	if n := b.q(t, `SELECT count(*) FROM (SELECT "offset", lag("offset") OVER (ORDER BY seq) AS prev FROM {{schema}}.effects) x WHERE prev > "offset"`); n != 0 {
		t.Fatalf("%d effects committed before an earlier offset's", n)
	}
}

func TestSecondConsumerJoiningMidStreamAddsNoDuplicateEffect(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	const n = 4000
	produce(t, b.brokers, b.topic, values(n, -1, func(i int) string { return fmt.Sprint(i) }))
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		time.Sleep(200 * time.Microsecond)
		return applyEffect(ctx, tx, b.schema, m)
	}
	cfgA := b.config(t)
	cfgA.Batch.Size = 50
	a := b.start(t, h, cfgA)
	waitFor(t, 60*time.Second, "a quarter processed", func() bool { return b.q(t, "SELECT count(*) FROM {{schema}}.effects") >= n/4 })
	cfgB := b.config(t)
	cfgB.Batch.Size = 50
	bb := b.start(t, h, cfgB)
	waitFor(t, 120*time.Second, "all processed", func() bool { return b.q(t, "SELECT count(*) FROM {{schema}}.effects") == n })
	if d := b.q(t, "SELECT count(*) FROM {{schema}}.effects WHERE applied <> 1"); d != 0 {
		t.Fatalf("%d duplicate effects after a second consumer joined", d)
	}
	if a.c.Stats().Processed == 0 || bb.c.Stats().Processed == 0 {
		t.Logf("processed: a=%d b=%d (the joiner may have arrived late)", a.c.Stats().Processed, bb.c.Stats().Processed)
	}
	if a.c.Stats().Processed+bb.c.Stats().Processed != n {
		t.Fatalf("processed a=%d + b=%d != %d", a.c.Stats().Processed, bb.c.Stats().Processed, n)
	}
}

func TestZombieCannotCommitPastAFencedWatermark(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, values(20, 0, func(i int) string { return fmt.Sprint(i) }))
	entered := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if err := applyEffect(ctx, tx, b.schema, m); err != nil {
			return err
		}
		if m.Offset == 2 {
			once.Do(func() { close(entered); <-release })
		}
		return nil
	}
	cfg := b.config(t)
	cfg.Batch.Wait = 200 * time.Millisecond
	b.start(t, h, cfg)
	<-entered
	// Another owner advanced the watermark to 8 while this one was mid-batch.
	b.exec(t, "UPDATE {{schema}}.watermarks SET next_offset = 8")
	close(release)
	waitFor(t, 60*time.Second, "watermark 20", func() bool {
		return b.q(t, "SELECT coalesce(max(next_offset), 0) FROM {{schema}}.watermarks") == 20
	})
	if n := b.q(t, `SELECT count(*) FROM {{schema}}.effects WHERE "offset" < 8`); n != 0 {
		t.Fatalf("the fenced batch committed %d effects below the other owner's watermark", n)
	}
	if n := b.q(t, `SELECT count(*) FROM {{schema}}.effects WHERE "offset" >= 8 AND applied = 1`); n != 12 {
		t.Fatalf("%d effects at or above the new watermark, want 12", n)
	}
}

func TestConfigRefusesAutoCommit(t *testing.T) {
	for _, k := range []string{"enable.auto.commit", "enable.auto.offset.store"} {
		_, err := (&Config{Kafka: kafka.ConfigMap{"bootstrap.servers": "x", "group.id": "g", k: true}, Topics: []string{"t"}}).settings()
		if err == nil || !strings.Contains(err.Error(), k) {
			t.Fatalf("%s=true: err %v", k, err)
		}
	}
	if _, err := (&Config{Kafka: kafka.ConfigMap{"bootstrap.servers": "x"}, Topics: []string{"t"}}).settings(); err == nil {
		t.Fatal("missing group.id accepted")
	}
}

func TestBackoffGrowsAndIsBounded(t *testing.T) {
	p := RetryPolicy{InitialBackoff: 100 * time.Millisecond, MaxBackoff: time.Second, Multiplier: 2, Jitter: 0.2}
	for _, c := range []struct {
		attempt int
		lo, hi  time.Duration
	}{{1, 80 * time.Millisecond, 120 * time.Millisecond}, {2, 160 * time.Millisecond, 240 * time.Millisecond}, {3, 320 * time.Millisecond, 480 * time.Millisecond}, {10, 800 * time.Millisecond, 1200 * time.Millisecond}} {
		for i := 0; i < 50; i++ {
			if d := p.Backoff(c.attempt); d < c.lo || d > c.hi {
				t.Fatalf("Backoff(%d) = %s, want in [%s, %s]", c.attempt, d, c.lo, c.hi)
			}
		}
	}
}

func TestDeadLetterIsWrittenToTheOutboxInItsTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, []testRecord{
		{key: []byte("a"), value: []byte(`{"ok":1}`)},
		{key: nil, value: []byte("not json"), headers: []kafka.Header{{Key: "trace", Value: []byte{0, 0xff}}}},
	})
	b.start(t, strictJSON(b.schema), b.config(t))
	waitFor(t, 60*time.Second, "watermark 2", func() bool {
		return b.q(t, "SELECT coalesce(max(next_offset), 0) FROM {{schema}}.watermarks") == 2
	})
	var key, value []byte
	var hk, hv [][]byte
	err := b.pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT key, value, header_keys, header_values FROM %s WHERE topic = $1`,
		pgx.Identifier{b.schema, "outbox"}.Sanitize()), b.topic+".dlq").Scan(&key, &value, &hk, &hv)
	if err != nil {
		t.Fatalf("no dead-letter record in the outbox: %v", err)
	}
	if key != nil || string(value) != "not json" {
		t.Fatalf("dead-letter record key %q value %q", key, value)
	}
	headers := map[string]string{}
	for i, k := range hk {
		headers[string(k)] = string(hv[i])
	}
	for k, want := range map[string]string{"trace": "\x00\xff", "kafkatx.dlq.original.topic": b.topic, "kafkatx.dlq.original.partition": "0",
		"kafkatx.dlq.original.offset": "1", "kafkatx.dlq.group": b.group, "kafkatx.dlq.error.class": ErrorClassPermanent} {
		if headers[k] != want {
			t.Fatalf("header %s = %q, want %q (all: %q)", k, headers[k], want, headers)
		}
	}
}

func TestRepublishedOutboxRecordHasNoSecondEffect(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	id := func(s string) []kafka.Header { return []kafka.Header{{Key: "kafkatx-outbox-id", Value: []byte(s)}} }
	produce(t, b.brokers, b.topic, []testRecord{
		{value: []byte(`{"n":1}`), headers: id("11111111-1111-1111-1111-111111111111")},
		{value: []byte(`{"n":2}`), headers: id("22222222-2222-2222-2222-222222222222")},
		{value: []byte(`{"n":1}`), headers: id("11111111-1111-1111-1111-111111111111")}, // a relay re-publish
		{value: []byte(`{"n":3}`)},
	})
	r := b.start(t, strictJSON(b.schema), b.config(t))
	waitFor(t, 60*time.Second, "watermark 4", func() bool {
		return b.q(t, "SELECT coalesce(max(next_offset), 0) FROM {{schema}}.watermarks") == 4
	})
	if n := b.q(t, `SELECT count(*) FROM {{schema}}.effects WHERE "offset" = 2`); n != 0 {
		t.Fatal("the re-published copy ran its handler")
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.effects"); n != 3 {
		t.Fatalf("%d effects, want 3", n)
	}
	if s := r.c.Stats(); s.Duplicates != 1 || s.Processed != 3 {
		t.Fatalf("stats %+v, want 1 duplicate and 3 processed", s)
	}
}

// TestPausedPartitionsResumeWithoutSkipping forces a pause and a resume around nearly every
// message (a 1-byte memory budget): librdkafka must resume each partition right after the
// last message it returned, so every message is still applied exactly once.
func TestPausedPartitionsResumeWithoutSkipping(t *testing.T) {
	t.Parallel()
	b := setup(t, 3)
	const n = 1500
	produce(t, b.brokers, b.topic, values(n, -1, func(i int) string { return fmt.Sprint(i) }))
	cfg := b.config(t)
	cfg.MaxBufferedBytes = 1
	cfg.Batch.Size = 10
	r := b.start(t, b.handler(), cfg)
	waitFor(t, 120*time.Second, "every message applied", func() bool { return b.q(t, "SELECT count(*) FROM {{schema}}.effects") == n })
	// With a 1-byte budget every partition pauses as soon as it holds a message its worker
	// has not taken: the test is about those pauses, so they must have happened.
	if p := r.c.Stats().Pauses; p < 3 {
		t.Fatalf("partitions paused %d times; want at least one pause per partition (3)", p)
	}
	if d := b.q(t, "SELECT count(*) FROM {{schema}}.effects WHERE applied <> 1"); d != 0 {
		t.Fatalf("%d duplicate effects", d)
	}
	if w := b.q(t, "SELECT sum(next_offset) FROM {{schema}}.watermarks"); w != n {
		t.Fatalf("watermarks sum to %d, want %d", w, n)
	}
}

// TestBackoffPausesOnlyItsPartition holds partition 0 in a long retry backoff while
// partition 1 has a backlog far larger than the memory budget: partition 1 must drain in the
// meantime (docs/design.md, "Poison pills and retries": blocking retries pause only the affected partition).
func TestBackoffPausesOnlyItsPartition(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	recs := append(values(5, 0, func(i int) string { return fmt.Sprintf("p0-%d", i) }),
		values(3000, 1, func(i int) string { return fmt.Sprintf("p1-%d", i) })...)
	produce(t, b.brokers, b.topic, recs)
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if string(m.Value) == "p0-1" {
			return errors.New("downstream unavailable")
		}
		return applyEffect(ctx, tx, b.schema, m)
	}
	cfg := b.config(t)
	cfg.MaxBufferedBytes = 256 << 10 // ~800 messages: partition 1 must pause and resume too
	cfg.Batch.Size = 50
	cfg.Retry = RetryPolicy{MaxAttempts: 3, InitialBackoff: 20 * time.Second, MaxBackoff: 20 * time.Second}
	r := b.start(t, h, cfg)
	start := time.Now()
	waitFor(t, 35*time.Second, "partition 1 drained while partition 0 backs off", func() bool {
		return b.q(t, "SELECT count(*) FROM {{schema}}.effects WHERE partition = 1") == 3000
	})
	// Partition 0 holds 5 small messages, far below its 128 KiB share: every pause is
	// partition 1's, which must have stopped fetching and resumed to drain 3,000 messages.
	if p := r.c.Stats().Pauses; p == 0 {
		t.Fatal("partition 1 never paused: the test did not exercise pause and resume under a backoff")
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.effects WHERE partition = 0"); n != 1 {
		t.Fatalf("partition 0 applied %d messages during its backoff, want 1 (the one before the failing message)", n)
	}
	t.Logf("partition 1 drained in %s while partition 0 waited", time.Since(start).Round(time.Millisecond))
}

// TestInflightMarkerReachesAtMostOneBatchAhead: while a batch runs, the durable in-flight
// marker covers that batch and at most one more, however many messages are already
// dispatched to the worker — after a crash every offset under the marker runs one message
// per transaction, so the marker's reach is the crash's price.
func TestInflightMarkerReachesAtMostOneBatchAhead(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	const n, size = 600, 20
	produce(t, b.brokers, b.topic, values(n, 0, func(i int) string { return fmt.Sprint(i) }))
	var mu sync.Mutex
	var worst, batches int64
	h := func(ctx context.Context, tx pgx.Tx, msgs []*Message) error {
		// The marker was committed before the handler runs; read it in this transaction.
		var next, inflight int64
		if err := tx.QueryRow(ctx, fmt.Sprintf(`SELECT next_offset, inflight_end FROM %s WHERE topic = $1`,
			pgx.Identifier{b.schema, "watermarks"}.Sanitize()), b.topic).Scan(&next, &inflight); err != nil {
			return err
		}
		mu.Lock()
		worst, batches = max(worst, inflight-next), batches+1
		mu.Unlock()
		time.Sleep(5 * time.Millisecond) // let the poll loop dispatch far ahead
		for _, m := range msgs {
			if err := applyEffect(ctx, tx, b.schema, m); err != nil {
				return err
			}
		}
		return nil
	}
	cfg := b.config(t)
	cfg.Batch.Size = size
	c, err := NewBatchConsumer(b.pool, h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := run(t, c)
	waitFor(t, 60*time.Second, "every message applied", func() bool { return b.q(t, "SELECT count(*) FROM {{schema}}.effects") == n })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if worst > 2*size || worst < size {
		t.Fatalf("in-flight marker reached %d offsets past the watermark (over %d batches), want between %d and %d", worst, batches, size, 2*size)
	}
}
