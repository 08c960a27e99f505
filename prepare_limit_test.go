package kafkatx

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/limit"
)

// TestPrepareLimitBoundsCallsOverEveryPartitionAndLane: 3 partitions × Concurrency 8 = 24
// lanes could call Prepare at once; Config.PrepareLimit (a fixed 3 here) holds the calls in
// flight to 3 over the whole consumer, and every message is applied once.
func TestPrepareLimitBoundsCallsOverEveryPartitionAndLane(t *testing.T) {
	t.Parallel()
	b := setup(t, 3)
	var recs []testRecord
	for p := int32(0); p < 3; p++ {
		recs = append(recs, values(40, p, func(i int) string { return fmt.Sprint(i) })...)
	}
	produce(t, b.brokers, b.topic, recs)
	var in, peak atomic.Int64
	cfg := b.config(t)
	cfg.Concurrency = 8
	cfg.Batch.Size = 1
	cfg.PrepareLimit = limit.Fixed(3)
	cfg.Prepare = func(ctx context.Context, msgs []*Message) error {
		n := in.Add(1)
		defer in.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(20 * time.Millisecond)
		return nil
	}
	r := b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error { return applyEffect(ctx, tx, b.schema, m) }, cfg)
	waitFor(t, 60*time.Second, "120 effects", func() bool { return b.q(t, "SELECT count(*) FROM {{schema}}.effects") == 120 })
	_ = r.stop(t)
	if p := peak.Load(); p > 3 || p < 2 {
		t.Fatalf("%d Prepare calls in flight at once, want 2..3 (PrepareLimit 3 over 24 lanes)", p)
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.effects WHERE applied <> 1"); n != 0 {
		t.Fatalf("%d duplicate effects", n)
	}
}

// TestPrepareLimitDefaultsToAdaptive: with Prepare set and no PrepareLimit, the consumer bounds
// Prepare by an adaptive limit with the package's defaults; without Prepare there is none.
func TestPrepareLimitDefaultsToAdaptive(t *testing.T) {
	cfg := (&Config{Prepare: func(context.Context, []*Message) error { return nil }}).WithDefaults()
	if cfg.PrepareLimit == nil || cfg.PrepareLimit.Limit() != limit.DefaultInitial || cfg.PrepareLimit.Config().Max != limit.DefaultMax {
		t.Fatalf("default PrepareLimit %+v", cfg.PrepareLimit)
	}
	if (&Config{}).WithDefaults().PrepareLimit != nil {
		t.Fatal("a PrepareLimit without Prepare")
	}
}
