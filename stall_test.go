package kafkatx

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Issue "outages a service must ride out" 2: the watchdog. A partition with lag whose
// watermark does not move for Config.StallAfter is reported whatever the cause — here a
// handler that waits (within every other bound) — in Readiness (not ready, naming the
// partition), Readiness.Stalled and kafkatx_partition_stalled; once it moves again the report
// clears.
func TestWatchdogReportsAPartitionWithLagAndNoProgress(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	cfg := b.config(t)
	cfg.StallAfter = 2 * time.Second
	cfg.Registerer = prometheus.NewRegistry()
	hook := &everyHook{}
	cfg.Hooks = []Hook{hook}
	release := make(chan struct{})
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if string(m.Value) == "wait" {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return applyEffect(ctx, tx, b.schema, m)
	}
	r := b.start(t, h, cfg)
	produce(t, b.brokers, b.topic, values(6, 0, func(i int) string {
		if i == 0 {
			return "wait"
		}
		return "go"
	}))
	waitFor(t, 30*time.Second, "the partition reported stalled", func() bool {
		rd := r.c.Readiness(context.Background())
		return len(rd.Stalled) == 1 && !rd.Ready && strings.Contains(strings.Join(rd.Reasons, "; "), "has made no progress since")
	})
	st := r.c.Readiness(context.Background()).Stalled[0]
	if st.Topic != b.topic || st.Partition != 0 || st.Watermark != 0 || st.LogEnd != 6 {
		t.Fatalf("stalled partition %+v; want %s[0] at watermark 0, log end 6", st, b.topic)
	}
	if got := testutil.ToFloat64(r.c.metrics.c.Stalled.WithLabelValues(b.group, b.topic, "0")); got != 1 {
		t.Fatalf("kafkatx_partition_stalled = %v, want 1", got)
	}
	stalled := PartitionStalled{Group: b.group, Topic: b.topic, Watermark: 0, LogEnd: 6, Stalled: true}
	if got := eventsOf[PartitionStalled](hook); len(got) != 1 || got[0] != stalled {
		t.Fatalf("HookPartitionStalled got %+v, want [%+v]", got, stalled)
	}
	close(release)
	waitFor(t, 30*time.Second, "all 6 applied and the report cleared", func() bool {
		return b.q(t, `SELECT count(*) FROM {{schema}}.effects`) == 6 && len(r.c.Readiness(context.Background()).Stalled) == 0
	})
	if got := testutil.ToFloat64(r.c.metrics.c.Stalled.WithLabelValues(b.group, b.topic, "0")); got != 0 {
		t.Fatalf("kafkatx_partition_stalled = %v after progress, want 0", got)
	}
	if got := eventsOf[PartitionStalled](hook); len(got) != 2 || got[1].Stalled || got[1].Watermark == 0 {
		t.Fatalf("HookPartitionStalled got %+v, want the stall and then its end past watermark 0", got)
	}
}
