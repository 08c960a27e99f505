package kafkatx

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/idempotency"
)

// TestNotAChangeIsSkippedAndCounted: a record the key function answers
// idempotency.ErrNotAChange for (a Debezium tombstone, heartbeat, transaction marker) is
// committed past without running the handler, counted in Stats.NotChanges, and never
// dead-lettered; its neighbours run as usual, in batches and alone.
func TestNotAChangeIsSkippedAndCounted(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	const n = 60
	produce(t, b.brokers, b.topic, values(n, 0, func(i int) string {
		switch {
		case i%10 == 3:
			return "heartbeat"
		case i == 25:
			return "fail-once" // runs alone after its failure: the skip holds in oneTx too
		}
		return fmt.Sprint(i)
	}))
	cfg := b.config(t)
	cfg.Batch.Size = 7
	cfg.Idempotency.Key = func(m idempotency.Message) (string, bool, error) {
		if string(m.Value) == "heartbeat" {
			return "", false, fmt.Errorf("a heartbeat: %w", idempotency.ErrNotAChange)
		}
		return "", false, nil
	}
	var calls, failed atomic.Int64
	r := b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if strings.Contains(string(m.Value), "heartbeat") {
			return Permanent(fmt.Errorf("the handler saw a record that is not a change (offset %d)", m.Offset))
		}
		calls.Add(1)
		if string(m.Value) == "fail-once" && failed.Add(1) == 1 {
			return fmt.Errorf("transient")
		}
		return applyEffect(ctx, tx, b.schema, m)
	}, cfg)
	waitFor(t, 60*time.Second, "the watermark at the log end", func() bool {
		return b.q(t, "SELECT coalesce(sum(next_offset), 0) FROM {{schema}}.watermarks") == n
	})
	s := r.c.Stats()
	if s.NotChanges != 6 || s.Processed != n-6 || s.DeadLettered != 0 {
		t.Fatalf("stats %+v; want NotChanges 6, Processed %d, DeadLettered 0", s, n-6)
	}
	if got := b.q(t, "SELECT count(*) FROM {{schema}}.effects"); got != n-6 {
		t.Fatalf("%d effects; want %d", got, n-6)
	}
	if got := b.q(t, "SELECT count(*) FROM {{schema}}.dead_letters"); got != 0 {
		t.Fatalf("%d dead letters; want 0", got)
	}
}
