package kafkatx

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
)

// produceTx writes values to partition 0 of topic in one transaction of a transactional
// producer, committed or aborted.
func produceTx(t *testing.T, brokers, topic string, commit bool, values ...string) {
	t.Helper()
	p, err := kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": brokers, "transactional.id": fmt.Sprintf("tx-%s-%v", topic, commit), "go.delivery.reports": false})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := p.InitTransactions(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for _, v := range values {
		if err := p.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: 0}, Value: []byte(v)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if commit {
		err = p.CommitTransaction(ctx)
	} else {
		p.Flush(10000) // the aborted records reach the log before the abort marker
		err = p.AbortTransaction(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// The watermark passes the markers after the last record only when the partition is idle:
// while the last record of a transaction is still failing (in its backoff) or still being
// handled, the fetch position is already past it and past the marker, and following it then
// would skip a record that has not committed. The handler fails the last record twice and
// takes 1.5 s over the batch before it, so the consumer's once-a-second check runs while
// records are in flight: the watermark stays at or below the failing record until it commits,
// every record is applied once, and then the watermark reaches the log end.
func TestWatermarkPassesMarkersOnlyWhenIdle(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produceTx(t, b.brokers, b.topic, false, "aborted-0", "aborted-1") // offsets 0, 1; abort marker 2
	produceTx(t, b.brokers, b.topic, true, "v3", "v4", "v5", "v6")    // offsets 3-6; commit marker 7
	const last, logEnd = 6, 8
	var mu sync.Mutex
	failures := 0
	// Offset 6 fails until the test has read the watermark while it was failing: a window
	// of two tries' backoff once passed inside one slow read on a loaded CI machine (no
	// sample, the case not exercised). Every read before released is one while it fails.
	var released atomic.Bool
	var watermarksWhileFailing []int64
	cfg := b.config(t)
	cfg.Batch.Size = 3
	cfg.Retry.MaxAttempts = 1000 // the failures last as long as the test takes to sample them
	cfg.Retry.InitialBackoff, cfg.Retry.MaxBackoff = 1200*time.Millisecond, 1200*time.Millisecond
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if m.Offset == 3 {
			time.Sleep(1500 * time.Millisecond)
		}
		if m.Offset == last {
			mu.Lock()
			failures++
			mu.Unlock()
			if !released.Load() {
				return errors.New("not yet")
			}
		}
		return applyEffect(ctx, tx, b.schema, m)
	}
	r := b.start(t, h, cfg)
	watermark := func() int64 { return b.q(t, "SELECT coalesce(max(next_offset), -1) FROM {{schema}}.watermarks") }
	deadline := time.Now().Add(60 * time.Second)
	for {
		mu.Lock()
		n := failures
		mu.Unlock()
		w := watermark()
		if n >= 1 && !released.Load() {
			watermarksWhileFailing = append(watermarksWhileFailing, w)
			if len(watermarksWhileFailing) >= 3 {
				released.Store(true)
			}
		}
		if w == logEnd {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("watermark %d after 60 s, want the log end %d", w, logEnd)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	for _, w := range watermarksWhileFailing {
		if w > last {
			t.Fatalf("watermark %d while offset %d was still failing: it passed a record that had not committed", w, last)
		}
	}
	if len(watermarksWhileFailing) == 0 {
		t.Fatal("no sample while the last record was failing: the test did not exercise the case")
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.effects WHERE applied = 1"); n != 4 {
		t.Fatalf("%d effects applied once, want 4", n)
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.effects WHERE value LIKE 'aborted%' OR applied <> 1"); n != 0 {
		t.Fatalf("%d aborted or repeated effects", n)
	}
	if k := b.committedOffsets(t, 1)[0]; k != logEnd {
		t.Fatalf("committed offset %d, want the log end %d", k, logEnd)
	}
	t.Logf("%d samples while failing, highest watermark then %d", len(watermarksWhileFailing), maxOf(watermarksWhileFailing))
}

func maxOf(xs []int64) int64 {
	m := int64(-1)
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}
