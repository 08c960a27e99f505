package kafkatx

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Config.Backpressure holds every partition back before its transaction: while it blocks
// nothing is applied and the messages count as in flight; once it lets go they are applied,
// each once. A throttle that panics or fails holds the batches (not ready, naming it) until it
// answers, for Config.UnavailableMaxWait at most (issue "outages" 3).
func TestBackpressureHoldsPartitionsBeforeTheirTransactions(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	release := make(chan struct{})
	var calls atomic.Int64
	cfg := b.config(t)
	cfg.Backpressure = func(ctx context.Context) error {
		calls.Add(1)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error { return applyEffect(ctx, tx, b.schema, m) }
	r := b.start(t, h, cfg)
	produce(t, b.brokers, b.topic, values(40, -1, func(i int) string { return "v" }))
	waitFor(t, 30*time.Second, "both partitions held back", func() bool { return calls.Load() >= 2 })
	time.Sleep(1500 * time.Millisecond) // a held partition must not run meanwhile
	if n := b.q(t, `SELECT count(*) FROM {{schema}}.effects`); n != 0 {
		t.Fatalf("%d effects applied while Backpressure held the partitions back", n)
	}
	if s := r.c.Stats(); s.InFlight == 0 || s.Processed != 0 || s.HeldBack == 0 {
		t.Fatalf("Stats while held back: %+v; want messages in flight and partitions held back, none processed", s)
	}
	close(release)
	waitFor(t, 30*time.Second, "all 40 applied", func() bool { return b.q(t, `SELECT count(*) FROM {{schema}}.effects`) == 40 })
	if n := b.q(t, `SELECT count(*) FROM {{schema}}.effects WHERE applied <> 1`); n != 0 {
		t.Fatalf("%d effects applied more than once", n)
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}

	// A throttle that panics, then fails (it cannot answer): the batches wait, nothing is
	// applied, and the consumer is not ready, naming it; once it answers they run.
	var mode atomic.Int64
	var broken atomic.Bool
	broken.Store(true)
	cfg2 := b.config(t)
	cfg2.Backpressure = func(context.Context) error {
		if !broken.Load() {
			return nil
		}
		if mode.Add(1)%2 == 1 {
			panic("throttle bug")
		}
		return context.DeadlineExceeded
	}
	r2 := b.start(t, h, cfg2)
	produce(t, b.brokers, b.topic, values(20, -1, func(i int) string { return "w" }))
	waitFor(t, 30*time.Second, "not ready, naming the failing Backpressure check", func() bool {
		rd := r2.c.Readiness(context.Background())
		return len(rd.BackpressureFailing) > 0 && !rd.Ready && strings.Contains(strings.Join(rd.Reasons, "; "), "Config.Backpressure cannot answer")
	})
	waitFor(t, 60*time.Second, "the failing check called again", func() bool { return mode.Load() >= 3 })
	if n := b.q(t, `SELECT count(*) FROM {{schema}}.effects`); n != 40 {
		t.Fatalf("%d effects after %d calls of a failing check; want 40 (held)", n, mode.Load())
	}
	broken.Store(false)
	waitFor(t, 30*time.Second, "all 60 applied once the throttle answers", func() bool { return b.q(t, `SELECT count(*) FROM {{schema}}.effects`) == 60 })
	waitFor(t, 60*time.Second, "no failing check reported", func() bool { return len(r2.c.Readiness(context.Background()).BackpressureFailing) == 0 })
	if err := r2.stop(t); err != nil {
		t.Fatal(err)
	}

	// A throttle that never answers holds the batches for Config.UnavailableMaxWait at most:
	// then they run — bounded, never a stall.
	cfg2b := b.config(t)
	cfg2b.UnavailableMaxWait = 2 * time.Second
	cfg2b.Backpressure = func(context.Context) error { return errors.New("throttle cannot read") }
	r2b := b.start(t, h, cfg2b)
	produce(t, b.brokers, b.topic, values(10, -1, func(i int) string { return "v2" }))
	waitFor(t, 30*time.Second, "all 70 applied past a check that never answers", func() bool { return b.q(t, `SELECT count(*) FROM {{schema}}.effects`) == 70 })
	if err := r2b.stop(t); err != nil {
		t.Fatal(err)
	}

	// Stopping while held back: the throttle's ctx ends and Run returns; the held messages
	// are left for the next run (applied once, by it).
	var held atomic.Int64
	cfg3 := b.config(t)
	cfg3.Backpressure = func(ctx context.Context) error {
		held.Add(1)
		<-ctx.Done()
		return ctx.Err()
	}
	r3 := b.start(t, h, cfg3)
	produce(t, b.brokers, b.topic, values(10, -1, func(i int) string { return "x" }))
	waitFor(t, 30*time.Second, "held back again", func() bool { return held.Load() >= 1 })
	if err := r3.stop(t); err != nil {
		t.Fatal(err)
	}
	r4 := b.start(t, h, b.config(t))
	waitFor(t, 30*time.Second, "the 10 held messages applied by the next run", func() bool { return b.q(t, `SELECT count(*) FROM {{schema}}.effects`) == 80 })
	if n := b.q(t, `SELECT count(*) FROM {{schema}}.effects WHERE applied <> 1`); n != 0 {
		t.Fatalf("%d effects applied more than once", n)
	}
	if err := r4.stop(t); err != nil {
		t.Fatal(err)
	}

	// A throttle that ignores its context does not hold Run past the shutdown timeout: the
	// worker leaves it behind once its work is aborted.
	ignore := make(chan struct{})
	var stuck atomic.Int64
	cfg5 := b.config(t)
	cfg5.ShutdownTimeout = time.Second
	cfg5.Backpressure = func(context.Context) error {
		stuck.Add(1)
		<-ignore // not ctx
		return nil
	}
	r5 := b.start(t, h, cfg5)
	produce(t, b.brokers, b.topic, values(4, -1, func(i int) string { return "y" }))
	waitFor(t, 30*time.Second, "held back by a throttle that ignores ctx", func() bool { return stuck.Load() >= 1 })
	if err := r5.stop(t); err != nil {
		t.Fatal(err)
	}
	close(ignore) // let the goroutines left behind end (goleak checks at the end)
}
