package relay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
)

// A topic whose max.message.bytes (16 KiB here) is below the batches librdkafka builds
// (batch.size, 1,000,000 bytes by default) refuses whole batches of records that each fit.
// The relay used to send every refused record alone, waiting for its delivery report: about
// 100 records a second, for as long as the load lasted. Now it learns the topic's limit and
// produces within it: every record that fits is published, in order, and
// only a record larger than the limit is sent alone (with at most a few chunks' last records)
// and parked.
func TestTopicWithSmallMaxMessageBytesIsPublishedWithinItsLimit(t *testing.T) {
	t.Parallel()
	testSmallMaxMessageBytes(t, false)
}

// The same when the topic's configuration cannot be read (no DescribeConfigs ACL): the first
// refused batch sets the chunk size instead, halved until chunks go through. Write order can
// break once, in the refused round (docs/relay.md), so only what was published is checked.
func TestTopicWithSmallMaxMessageBytesAndNoDescribeConfigs(t *testing.T) {
	t.Parallel()
	testSmallMaxMessageBytes(t, true)
}

func testSmallMaxMessageBytes(t *testing.T, noDescribe bool) {
	b := setup(t)
	topic := testenv.TopicWithConfig(t, b.brokers, 1, map[string]string{"max.message.bytes": "16384"})
	cfg := b.config(t)
	cfg.KeepPublished = 0
	r, err := New(b.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if noDescribe {
		r.testHookMaxMessageBytes = func(string) (int, error) {
			return 0, errors.New("Broker: Topic authorization failed")
		}
	}
	b.run(t, r)
	const n = 3000
	var recs []outbox.Record
	var want []string
	for i := 0; i < n; i++ {
		v := fmt.Sprintf("%05d-%s", i, strings.Repeat("v", 200))
		recs = append(recs, outbox.Record{Topic: topic, Key: []byte(fmt.Sprintf("k%d", i%50)), Value: []byte(v)})
		want = append(want, v[:5])
		if i == n/2 {
			recs = append(recs, outbox.Record{Topic: topic, Key: []byte("big"), Value: bytes.Repeat([]byte("x"), 20000)})
		}
	}
	b.write(t, recs[:n/3]...)
	b.write(t, recs[n/3:]...)
	waitFor(t, 120*time.Second, "every record that fits published", func() bool { return r.Stats().Published >= n })
	if s := r.Stats(); s.Published != n || s.Parked != 1 {
		t.Fatalf("published %d, parked %d; want %d and the one record over the limit", s.Published, s.Parked, n)
	}
	var got []string
	for _, m := range readAll(t, b.brokers, topic) {
		got = append(got, string(m.Value[:5]))
	}
	if noDescribe {
		slices.Sort(got)
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("published %d records out of write order (first %.60s…)", len(got), strings.Join(got, ","))
	}
	// Alone: the record over the limit, and at most a chunk's last record now and then; one
	// at a time, it was every record of every refused batch (thousands).
	if alone := r.c.alone.Load(); alone < 1 || alone > 5 {
		t.Fatalf("%d records produced alone, want the one over the limit and at most a few more", alone)
	}
}

// When the broker cannot be asked for the topic's max.message.bytes the topic has no budget
// until a batch is refused: then half of what was refused, halved again by each refused
// chunk, down to a record alone.
func TestSizeBudgetHalvesWhenTheTopicsLimitIsUnknown(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, p := b.bareRelay(t, batchBytes(kafka.ConfigMap{"batch.size": 500000}))
	r.testHookMaxMessageBytes = func(string) (int, error) { return 0, errors.New("Broker: Topic authorization failed") }
	if r.batchBytes != 500000 {
		t.Fatalf("batchBytes %d, want batch.size 500000", r.batchBytes)
	}
	ctx := context.Background()
	now := time.Now()
	topic := testenv.Topic(t, b.brokers, 3)
	rows := []row{{topic: topic}}
	r.ask(ctx, p, rows, now)
	if r.limits.any(rows) {
		t.Fatalf("a budget %+v without an answer from the broker", r.limits[topic])
	}
	r.tighten(p, topic, 100_000, now)
	if got, ok := r.limits.of(topic); !ok || got != 50_000 {
		t.Fatalf("budget %d (%v) after 100,000 bytes refused, want 50,000", got, ok)
	}
	if n := r.limits[topic].partitions; n != 3 {
		t.Fatalf("budget over %d partitions, want the topic's 3", n)
	}
	r.tighten(p, topic, 30_000, now)
	if got, _ := r.limits.of(topic); got != 15_000 {
		t.Fatalf("budget %d after a 30,000-byte chunk refused, want 15,000", got)
	}
	for range 20 {
		r.tighten(p, topic, 1_000_000, now)
	}
	if got, _ := r.limits.of(topic); got != 1 {
		t.Fatalf("budget %d after many refusals, want 1 (a record alone)", got)
	}
	// An unanswered ask keeps the budget learned.
	r.ask(ctx, p, rows, now.Add(limitTTL+time.Second))
	if got, _ := r.limits.of(topic); got != 1 {
		t.Fatalf("budget %d after an unanswered ask, want the learned 1 kept", got)
	}
}

// An ask the broker did not answer (the topic did not exist yet: its rows wait aside until it
// does) is made again after askRetry, not after limitTTL: a topic created a few seconds later
// with a small limit gets its budget before a batch of it is refused.
func TestUnansweredAskIsRetriedSoon(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, p := b.bareRelay(t, 1_000_000)
	exists := false
	asked := 0
	r.testHookMaxMessageBytes = func(string) (int, error) {
		asked++
		if !exists {
			return 0, errors.New("Broker: Unknown topic or partition")
		}
		return 16384, nil
	}
	topic := testenv.Topic(t, b.brokers, 1)
	rows := []row{{topic: topic}}
	now := time.Now()
	r.ask(context.Background(), p, rows, now)
	exists = true
	r.ask(context.Background(), p, rows, now.Add(askRetry/2))
	if asked != 1 {
		t.Fatalf("asked %d times within askRetry, want 1", asked)
	}
	r.ask(context.Background(), p, rows, now.Add(askRetry+time.Second))
	if got, ok := r.limits.of(topic); asked != 2 || !ok || got != 16384-limitMargin {
		t.Fatalf("after askRetry: asked %d times, budget %d (%v); want 2 and %d", asked, got, ok, 16384-limitMargin)
	}
	r.ask(context.Background(), p, rows, now.Add(askRetry+limitTTL/2))
	if asked != 2 {
		t.Fatalf("an answered ask made again within limitTTL (%d asks)", asked)
	}
}

// A record over a small topic's limit produced beside another topic's rows (which join any
// chunk) is still the only record of its partition in flight: parked at its first attempt,
// and the topic's budget is left as it was. It used to count as batched: retried 16–75 times
// while the other topic flowed, each refusal halving the budget, down to one record a chunk
// (1,000 rows of 260 bytes then took 6.6 s instead of 0.2 s). Found by a fresh-eyes attack.
func TestRecordOverTheLimitBesideAnotherTopicIsParkedAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	small := testenv.TopicWithConfig(t, b.brokers, 1, map[string]string{"max.message.bytes": "16384"})
	other := testenv.Topic(t, b.brokers, 1)
	cfg := b.config(t)
	cfg.KeepPublished = 0
	r, _ := b.start(t, cfg)
	b.write(t, outbox.Record{Topic: small, Key: []byte("w"), Value: []byte("warm")})
	waitFor(t, 60*time.Second, "warm-up", func() bool { return r.Stats().Published >= 1 })

	var recs []outbox.Record
	for i := range 200 {
		recs = append(recs, outbox.Record{Topic: other, Key: []byte(fmt.Sprint(i % 10)), Value: []byte("o")})
		if i == 100 {
			recs = append(recs, outbox.Record{Topic: small, Key: []byte("big"), Value: bytes.Repeat([]byte("x"), 20000)})
		}
	}
	ids := b.write(t, recs...)
	big := ids[101]
	waitFor(t, 30*time.Second, "the record over the limit parked", func() bool { return b.states(t)[big] == "parked" })
	var attempts int
	if err := b.pool.QueryRow(context.Background(), `SELECT attempts FROM `+b.t.Outbox+` WHERE id = $1`, big).Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	if attempts != 1 {
		t.Errorf("the record over the limit was parked after %d attempts, want 1", attempts)
	}
	waitFor(t, 30*time.Second, "the other topic's rows published", func() bool { return r.Stats().Published >= 201 })

	const n = 1000
	recs = recs[:0]
	for i := range n {
		recs = append(recs, outbox.Record{Topic: small, Key: []byte(fmt.Sprintf("k%d", i%50)), Value: []byte(strings.Repeat("v", 200))})
	}
	alone := r.c.alone.Load()
	b.write(t, recs...)
	waitFor(t, 120*time.Second, "the small topic's rows published", func() bool { return r.Stats().Published >= 201+n })
	if a := r.c.alone.Load() - alone; a > 5 {
		t.Errorf("%d of %d rows of the small topic produced alone after the parked record: its budget collapsed", a, n)
	}
}

// A topic found missing is answered once a round: a round that produces in chunks (each
// waiting for its reports) used to ask again per chunk, so a key's first row was set aside
// while its second, in a later chunk past UnknownTopicTimeout, was parked — and the first
// then waited behind the second. Found by a fresh-eyes attack.
func TestMissingTopicIsOneAnswerForTheWholeRound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	small := testenv.TopicWithConfig(t, b.brokers, 1, map[string]string{"max.message.bytes": "16384"})
	missing := testenv.UniqueName(t, "kafkatx-test-missing-", 200)
	cfg := b.config(t)
	cfg.KeepPublished = 0
	cfg.BatchSize = 5000
	cfg.UnknownTopicTimeout = 200 * time.Millisecond
	r, _ := b.start(t, cfg)
	b.write(t, outbox.Record{Topic: small, Key: []byte("w"), Value: []byte("warm")})
	waitFor(t, 60*time.Second, "warm-up", func() bool { return r.Stats().Published >= 1 })

	recs := []outbox.Record{{Topic: missing, Key: []byte("k"), Value: []byte("first")}}
	for i := range 3000 {
		recs = append(recs, outbox.Record{Topic: small, Key: []byte(fmt.Sprintf("k%d", i%50)), Value: []byte(strings.Repeat("v", 250))})
	}
	recs = append(recs, outbox.Record{Topic: missing, Key: []byte("k"), Value: []byte("second")})
	ids := b.write(t, recs...)
	first, second := ids[0], ids[len(ids)-1]
	waitFor(t, 60*time.Second, "a row of the missing topic parked", func() bool {
		st := b.states(t)
		return st[first] == "parked" || st[second] == "parked"
	})
	waitFor(t, 60*time.Second, "the small topic's rows published", func() bool { return r.Stats().Published >= 3001 })
	if st := b.states(t); st[first] != "parked" || st[second] != "pending" {
		t.Fatalf("key k: first row %q, second %q; want the first parked and the second pending behind it", st[first], st[second])
	}
}

func TestBatchBytesIsTheSmallerOfBatchSizeAndMessageMaxBytes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cfg  kafka.ConfigMap
		want int
	}{
		{kafka.ConfigMap{}, 1_000_000},
		{kafka.ConfigMap{"batch.size": 16384}, 16384},
		{kafka.ConfigMap{"message.max.bytes": "200000"}, 200_000},
		{kafka.ConfigMap{"batch.size": 2_000_000}, 1_000_000},
		// Both raised: librdkafka builds batches of 2,000,000 bytes (found by a fresh-eyes
		// attack: 1,000,000 was returned, a 1.5 MB topic got no budget and per-key order broke).
		{kafka.ConfigMap{"batch.size": 2_000_000, "message.max.bytes": 3_000_000}, 2_000_000},
	} {
		if got := batchBytes(c.cfg); got != c.want {
			t.Errorf("batchBytes(%v) = %d, want %d", c.cfg, got, c.want)
		}
	}
}

// With batch.size and message.max.bytes raised to 2 and 3 MB, a topic taking 1.5 MB gets a
// budget: no row is refused as too large, and every key is published in write order.
func TestRaisedBatchSizeAboveTheTopicsLimitGetsABudget(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testenv.TopicWithConfig(t, b.brokers, 1, map[string]string{"max.message.bytes": "1500000"})
	cfg := b.config(t)
	cfg.KeepPublished = 0
	cfg.BatchSize = 3000
	cfg.Kafka["batch.size"] = 2_000_000
	cfg.Kafka["message.max.bytes"] = 3_000_000
	cfg.Kafka["linger.ms"] = 50
	r, _ := b.start(t, cfg)
	const n = 3000
	var recs []outbox.Record
	for i := range n {
		recs = append(recs, outbox.Record{Topic: topic, Key: []byte(fmt.Sprintf("k%d", i%50)), Value: []byte(fmt.Sprintf("%05d-%s", i, strings.Repeat("v", 1000)))})
	}
	b.write(t, recs...)
	waitFor(t, 120*time.Second, "published", func() bool { return r.Stats().Published >= n })
	if s := r.Stats(); s.Retried > 0 || s.Parked > 0 {
		t.Fatalf("%d rows retried, %d parked: refused as too large although the topic's limit was readable", s.Retried, s.Parked)
	}
	requireKeyOrder(t, b.brokers, topic)
}

// The budget is per partition where the partition is known before producing (an explicit
// partition, or the key's murmur2 partition): records over half a small topic's limit, spread
// over 6 partitions, go six to a chunk, not one at a time (600 records of 8 KB: 600 produced
// alone, 3.7–4.0 s, against 0.2 s on a topic without the limit). Found by a fresh-eyes attack.
func TestLargeRecordsOverSixPartitionsShareChunks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testenv.TopicWithConfig(t, b.brokers, 6, map[string]string{"max.message.bytes": "16384"})
	cfg := b.config(t)
	cfg.KeepPublished = 0
	r, _ := b.start(t, cfg)
	const n = 600
	var recs []outbox.Record
	for i := range n {
		recs = append(recs, outbox.Record{Topic: topic, Key: []byte(fmt.Sprintf("k%d", i%60)), Value: []byte(fmt.Sprintf("%05d-%s", i, strings.Repeat("v", 8000)))})
	}
	recs = append(recs, outbox.Record{Topic: topic, Value: []byte("nil key: any partition")})
	b.write(t, recs...)
	waitFor(t, 120*time.Second, "published", func() bool { return r.Stats().Published >= n+1 })
	if s := r.Stats(); s.Retried > 0 || s.Parked > 0 {
		t.Fatalf("%d retried, %d parked; want none refused", s.Retried, s.Parked)
	}
	// Chunks are cut in row order at the first record whose partition is full, so some hold
	// one record (31 of 600 when measured); counted per topic, all 600 did.
	if alone := r.c.alone.Load(); alone > n/4 {
		t.Fatalf("%d of %d records produced alone: the budget is counted per topic, not per partition", alone, n)
	}
	requireKeyOrder(t, b.brokers, topic)
}

func TestChunkUseCountsUnknownPartitionsAgainstEveryPartition(t *testing.T) {
	t.Parallel()
	u := &chunkUse{byPartition: map[int32]int{}}
	u.add(0, true, 600)
	if !u.fits(1, true, 600, 1000) {
		t.Fatal("a record of another partition does not fit beside one of partition 0")
	}
	if u.fits(0, true, 600, 1000) {
		t.Fatal("two 600-byte records of partition 0 fit a 1,000-byte budget")
	}
	if u.fits(0, false, 600, 1000) {
		t.Fatal("a record of unknown partition fits beside 600 bytes that may share its partition")
	}
	u.add(1, true, 300)
	u.add(2, false, 300)
	if !u.fits(1, true, 300, 1000) || u.fits(0, true, 200, 1000) {
		t.Fatalf("after 600 on 0, 300 on 1 and 300 anywhere: %+v", u)
	}
	w := &row{key: []byte("k1")}
	if p, ok := partitionOf(w, 6, true); !ok || p != int32((murmur2([]byte("k1"))&0x7fffffff)%6) {
		t.Fatalf("partitionOf keyed row = %d, %v", p, ok)
	}
	if _, ok := partitionOf(w, 6, false); ok {
		t.Fatal("a keyed row's partition known under another partitioner")
	}
	if _, ok := partitionOf(&row{}, 6, true); ok {
		t.Fatal("a nil key's partition known (murmur2_random puts it anywhere)")
	}
	two := int32(2)
	if p, ok := partitionOf(&row{partition: &two}, 0, false); !ok || p != 2 {
		t.Fatalf("explicit partition: %d, %v", p, ok)
	}
}

func addPartitions(t *testing.T, brokers, topic string, total int) {
	t.Helper()
	a, err := kafka.NewAdminClient(&kafka.ConfigMap{"bootstrap.servers": brokers})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := a.CreatePartitions(ctx, []kafka.PartitionsSpecification{{Topic: topic, IncreaseTo: total}})
	if err == nil && res[0].Error.Code() != kafka.ErrNoError {
		err = res[0].Error
	}
	if err != nil {
		t.Fatal(err)
	}
}

// Partitions added to a small topic while the relay runs: librdkafka spreads keys over the
// new count before the relay's next ask, two records counted on two partitions share one, and
// the broker refuses their batch. The refusal re-reads the partition count and the budget
// starts again from the topic's limit; it used to be halved below one record and kept, every
// record alone until a restart (186, then 600 of 600). Found by a fresh-eyes attack.
func TestPartitionsAddedWhileRunningKeepChunksShared(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testenv.TopicWithConfig(t, b.brokers, 6, map[string]string{"max.message.bytes": "16384"})
	cfg := b.config(t)
	cfg.KeepPublished = 0
	cfg.Kafka["topic.metadata.refresh.interval.ms"] = 1000
	r, _ := b.start(t, cfg)
	b.write(t, outbox.Record{Topic: topic, Key: []byte("w"), Value: []byte("warm")})
	waitFor(t, 60*time.Second, "warm-up", func() bool { return r.Stats().Published >= 1 })
	addPartitions(t, b.brokers, topic, 7)
	time.Sleep(3 * time.Second) // librdkafka sees the seventh partition (metadata every second)
	const n = 600
	var recs []outbox.Record
	for i := range n {
		recs = append(recs, outbox.Record{Topic: topic, Key: []byte(fmt.Sprintf("k%d", i%60)), Value: []byte(fmt.Sprintf("%05d-%s", i, strings.Repeat("v", 10000)))})
	}
	b.write(t, recs...)
	waitFor(t, 120*time.Second, "published", func() bool { return r.Stats().Published >= n+1 })
	alone := r.c.alone.Load()
	b.write(t, recs...)
	waitFor(t, 120*time.Second, "published again", func() bool { return r.Stats().Published >= 2*n+1 })
	if a := r.c.alone.Load() - alone; a > n/4 {
		t.Fatalf("after 6 -> 7 partitions, %d of %d records of the second pass produced alone", a, n)
	}
	if s := r.Stats(); s.Parked > 0 {
		t.Fatalf("%d rows parked, want none (every record fits the topic)", s.Parked)
	}
}

// A nil key on a compacted topic is refused by the broker with its whole batch. The relay
// reads cleanup.policy with max.message.bytes and parks such a row before sending it, so the
// rest of the batch is published at once and in order; it used to send every row of the
// refused batches again alone (10,691–11,423 of 20,000) and log thousands of per-key order
// breaks. Found by a fresh-eyes attack.
func TestNilKeyOnACompactedTopicIsParkedBeforeSending(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testenv.TopicWithConfig(t, b.brokers, 3, map[string]string{"cleanup.policy": "compact"})
	core, logs := observer.New(zap.ErrorLevel)
	cfg := b.config(t)
	cfg.KeepPublished = 0
	cfg.Logger = zap.New(core)
	r, _ := b.start(t, cfg)
	const n = 3000
	var recs []outbox.Record
	var nils []int
	for i := range n {
		if i%1000 == 500 {
			recs = append(recs, outbox.Record{Topic: topic, Value: []byte("nil key")})
			nils = append(nils, len(recs)-1)
		}
		recs = append(recs, outbox.Record{Topic: topic, Key: []byte(fmt.Sprintf("k%d", i%50)), Value: []byte(fmt.Sprintf("%05d", i))})
	}
	ids := b.write(t, recs...)
	waitFor(t, 60*time.Second, "the keyed rows published", func() bool { return r.Stats().Published >= n })
	st := b.states(t)
	for _, i := range nils {
		var attempts int
		var lastErr string
		if err := b.pool.QueryRow(context.Background(), `SELECT attempts, last_error FROM `+b.t.Outbox+` WHERE id = $1`, ids[i]).Scan(&attempts, &lastErr); err != nil {
			t.Fatal(err)
		}
		if st[ids[i]] != "parked" || attempts != 1 || !strings.Contains(lastErr, "compacted topic") {
			t.Errorf("nil-key row: %s after %d attempts (%q), want parked at once", st[ids[i]], attempts, lastErr)
		}
	}
	if s := r.Stats(); s.Retried > 0 || s.Parked != int64(len(nils)) {
		t.Errorf("retried %d, parked %d; want 0 and %d", s.Retried, s.Parked, len(nils))
	}
	if n := logs.FilterMessageSnippet("per-key order broken").Len(); n > 0 {
		t.Errorf("%d per-key order breaks logged", n)
	}
	requireKeyOrder(t, b.brokers, topic)
}

// requireKeyOrder fails t when a keyed record of topic was published after a later-written
// record of its key; the tests write values that begin with the write index as %05d.
func requireKeyOrder(t *testing.T, brokers, topic string) {
	t.Helper()
	last := map[string]string{}
	for _, m := range readAll(t, brokers, topic) {
		if m.Key == nil || len(m.Value) < 5 {
			continue
		}
		v := string(m.Value[:5])
		if v < last[string(m.Key)] {
			t.Fatalf("key %s: %s published after %s", m.Key, v, last[string(m.Key)])
		}
		last[string(m.Key)] = v
	}
}

// bareRelay returns a Relay with only what ask and tighten use, and a producer on the test
// broker (closed when the test ends), for driving the size budget step by step.
func (b *testBundle) bareRelay(t *testing.T, batchBytes int) (*Relay, *producer) {
	t.Helper()
	p, err := newProducer(kafka.ConfigMap{"bootstrap.servers": b.brokers}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.close)
	return &Relay{log: zap.NewNop(), limits: sizeLimits{}, batchBytes: batchBytes}, p
}
