package kafkatx

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestStuckHandlerIsReportedAndCloseFinishes: a handler that never returns and ignores its
// context is reported once past its bound (Config.Transaction's statement plus idle timeouts):
// readiness not ready naming its partition and offset, kafkatx_partition_stuck 1. Stopping the
// consumer finishes within ShutdownTimeout + CloseTimeout (and the Kafka client's close):
// the handler's transaction is abandoned — rolled back, its write not committed — and the
// partition released, so the next consumer applies the message once.
func TestStuckHandlerIsReportedAndCloseFinishes(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, values(1, 0, func(int) string { return `{"a":1}` }))
	release := make(chan struct{})
	var released atomic.Bool
	t.Cleanup(func() {
		if !released.Swap(true) {
			close(release)
		}
		time.Sleep(500 * time.Millisecond) // the abandoned worker returns
	})
	cfg := b.config(t)
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	hook := &everyHook{}
	cfg.Hooks = []Hook{hook}
	cfg.Transaction.StatementTimeout, cfg.Transaction.IdleTimeout = time.Second, time.Second
	cfg.ShutdownTimeout, cfg.CloseTimeout = time.Second, 2*time.Second
	r := b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if err := applyEffect(ctx, tx, b.schema, m); err != nil {
			return err
		}
		<-release // ignores ctx
		return nil
	}, cfg)
	waitFor(t, 60*time.Second, "the handler reported stuck", func() bool {
		rd := r.c.Readiness(context.Background())
		return len(rd.Stuck) == 1 && !rd.Ready
	})
	rd := r.c.Readiness(context.Background())
	if s := rd.Stuck[0]; s.Partition != 0 || s.Offset != 0 || !strings.Contains(strings.Join(rd.Reasons, " "), "offset 0") {
		t.Fatalf("readiness: %+v", rd)
	}
	waitFor(t, 60*time.Second, "kafkatx_partition_stuck 1", func() bool {
		return testutil.CollectAndCount(mustGauge(t, reg, "kafkatx_partition_stuck")) == 1 &&
			testutil.ToFloat64(mustGauge(t, reg, "kafkatx_partition_stuck")) == 1
	})
	if got := eventsOf[HandlerStuck](hook); len(got) != 1 || got[0].Topic != b.topic || got[0].Offset != 0 || !got[0].Stuck || got[0].Since.IsZero() {
		t.Fatalf("HookHandlerStuck got %+v, want one stuck call on offset 0", got)
	}
	start := time.Now()
	stopped := make(chan error, 1)
	go func() { stopped <- r.stop(t) }()
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("the consumer did not stop within 30 s while a handler ignored its context")
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Fatalf("stopping took %s; want ShutdownTimeout + CloseTimeout and the Kafka close", d)
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.effects"); n != 0 {
		t.Fatalf("%d effects of the abandoned transaction committed", n)
	}
	released.Store(true)
	close(release) // the abandoned handler returns now; its transaction cannot commit
	time.Sleep(500 * time.Millisecond)
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.effects"); n != 0 {
		t.Fatalf("the abandoned handler's transaction committed after it returned")
	}
	cfg2 := b.config(t)
	b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error { return applyEffect(ctx, tx, b.schema, m) }, cfg2)
	waitFor(t, 60*time.Second, "the next consumer applies the message", func() bool {
		return b.q(t, "SELECT count(*) FROM {{schema}}.effects WHERE applied = 1") == 1
	})
}
