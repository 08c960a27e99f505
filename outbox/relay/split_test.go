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
	p, err := newProducer(kafka.ConfigMap{"bootstrap.servers": "127.0.0.1:1"}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	r := &Relay{log: zap.NewNop(), limits: sizeLimits{}, batchBytes: batchBytes(kafka.ConfigMap{"batch.size": 500000})}
	if r.batchBytes != 500000 {
		t.Fatalf("batchBytes %d, want batch.size 500000", r.batchBytes)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	now := time.Now()
	rows := []row{{topic: "t"}}
	r.ask(ctx, p, rows, now)
	if r.limits.any(rows) {
		t.Fatalf("a budget %+v without an answer from the broker", r.limits["t"])
	}
	r.tighten("t", 100_000, now)
	if got, ok := r.limits.of("t"); !ok || got != 50_000 {
		t.Fatalf("budget %d (%v) after 100,000 bytes refused, want 50,000", got, ok)
	}
	r.tighten("t", 30_000, now)
	if got, _ := r.limits.of("t"); got != 15_000 {
		t.Fatalf("budget %d after a 30,000-byte chunk refused, want 15,000", got)
	}
	for range 20 {
		r.tighten("t", 1_000_000, now)
	}
	if got, _ := r.limits.of("t"); got != 1 {
		t.Fatalf("budget %d after many refusals, want 1 (a record alone)", got)
	}
	// Asked again within limitTTL: not asked (the budget stays); after it, an unanswered ask
	// keeps the budget learned.
	r.ask(ctx, p, rows, now.Add(limitTTL+time.Second))
	if got, _ := r.limits.of("t"); got != 1 {
		t.Fatalf("budget %d after an unanswered ask, want the learned 1 kept", got)
	}
}
