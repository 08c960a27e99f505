package kafkatx

import (
	"github.com/kafkatx/kafkatx/internal/engine"

	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A handler answering Unavailable for one partition's messages: that partition waits (no
// attempt recorded, no transaction held, the consumer not idle), the other goes on, and
// everything is applied once when the dependency comes back.
func TestUnavailableWaitsWithoutAttemptsAndResumes(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	produce(t, b.brokers, b.topic, append(values(10, 0, func(i int) string { return fmt.Sprintf(`{"p0":%d}`, i) }),
		values(10, 1, func(i int) string { return fmt.Sprintf(`{"p1":%d}`, i) })...))
	var down atomic.Bool
	down.Store(true)
	var calls, pid atomic.Int64
	cfg := b.config(t)
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	cfg.Retry.MaxAttempts = 2
	r := b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if err := applyEffect(ctx, tx, b.schema, m); err != nil {
			return err
		}
		if m.Partition == 0 && down.Load() {
			var p int64
			if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&p); err != nil {
				return err
			}
			pid.Store(p)
			calls.Add(1)
			return fmt.Errorf("call the orchestrator: %w", Unavailable(errors.New("401 Token Expired")))
		}
		return nil
	}, cfg)
	waitFor(t, 60*time.Second, "partition 1 done and partition 0 waiting", func() bool {
		// The handler's 7th answer and the loop's count of it are not one step: wait for both.
		return b.q(t, "SELECT count(*) FROM {{schema}}.effects WHERE partition = 1") == 10 && calls.Load() >= 7 && r.c.Stats().Unavailable >= 7
	})
	// Backoffs from 20 ms doubling: the wait after the 7th answer is about 1.3 s.
	s := r.c.Stats()
	if s.Waiting != 1 || s.InFlight == 0 || s.Unavailable < 7 {
		t.Fatalf("stats while waiting: %+v; want Waiting 1, InFlight > 0, Unavailable >= 7", s)
	}
	rd := r.c.Readiness(context.Background())
	if len(rd.Waiting) != 1 || rd.Waiting[0].Partition != 0 || !strings.Contains(rd.Waiting[0].Cause, "401 Token Expired") || rd.Waiting[0].Since.IsZero() {
		t.Fatalf("readiness while partition 0 waits: %+v; want it listed with its cause and start", rd.Waiting)
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.attempts"); n != 0 {
		t.Fatalf("%d attempt rows while waiting for a dependency; want none", n)
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.effects WHERE partition = 0"); n != 0 {
		t.Fatalf("%d effects of the waiting partition committed", n)
	}
	// The connection of the rolled-back try goes back to the pool (other work may use it);
	// it never sits in an open transaction during the wait.
	for i := 0; i < 10; i++ {
		var state string
		if err := b.pool.QueryRow(context.Background(), "SELECT coalesce(state, '') FROM pg_stat_activity WHERE pid = $1", pid.Load()).Scan(&state); err != nil {
			t.Fatal(err)
		}
		if state == "idle in transaction" {
			t.Fatalf("the waiting partition's connection is %q: a transaction is held during the wait", state)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := testutil.ToFloat64(r.c.metrics.c.Waiting.WithLabelValues(b.group, b.topic, "0")); got != 1 {
		t.Fatalf("kafkatx_partition_waiting = %v, want 1", got)
	}
	down.Store(false)
	waitFor(t, 60*time.Second, "partition 0 done", func() bool {
		return b.q(t, "SELECT count(*) FROM {{schema}}.effects WHERE partition = 0") == 10
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	s = r.c.Stats()
	if s.DeadLettered != 0 || s.Retries != 0 || s.Waiting != 0 || s.Processed != 20 {
		t.Fatalf("stats after: %+v", s)
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.effects WHERE applied <> 1"); n != 0 {
		t.Fatalf("%d effects applied twice", n)
	}
	if got := testutil.ToFloat64(r.c.metrics.c.Unavailable.WithLabelValues(b.group, b.topic)); got < 7 {
		t.Fatalf("kafkatx_dependency_unavailable_total = %v", got)
	}
}

// Past Config.UnavailableMaxWait the answers count as ordinary failures: retried per
// Config.Retry and dead-lettered.
func TestUnavailablePastItsWindowCountsAsAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, values(2, 0, func(i int) string { return fmt.Sprintf(`{"n":%d}`, i) }))
	cfg := b.config(t)
	cfg.Retry.MaxAttempts = 2
	cfg.UnavailableMaxWait = 500 * time.Millisecond
	var first atomic.Int64
	start := time.Now()
	r := b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if m.Offset == 0 {
			first.CompareAndSwap(0, time.Since(start).Nanoseconds())
			return Unavailable(errors.New("DAG not found"))
		}
		return applyEffect(ctx, tx, b.schema, m)
	}, cfg)
	waitFor(t, 60*time.Second, "offset 0 dead-lettered and offset 1 applied", func() bool {
		return b.q(t, "SELECT count(*) FROM {{schema}}.dead_letters") == 1 && b.q(t, "SELECT count(*) FROM {{schema}}.effects") == 1
	})
	waited := time.Since(start) - time.Duration(first.Load())
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if waited < 500*time.Millisecond {
		t.Fatalf("dead-lettered %v after the first answer, before the 500ms window", waited)
	}
	if n := b.q(t, "SELECT attempts FROM {{schema}}.dead_letters"); n != 2 {
		t.Fatalf("dead letter after %d attempts, want MaxAttempts 2", n)
	}
	if s := r.c.Stats(); s.Waiting != 0 || s.Unavailable == 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestHTTPFailuresAreNotDatabaseErrors(t *testing.T) {
	t.Parallel()
	refused := &url.Error{Op: "Post", URL: "http://127.0.0.1:1/api/v2/dags/d/dagRuns", Err: syscall.ECONNREFUSED}
	if engine.RetryableDB(fmt.Errorf("trigger: %w", refused)) {
		t.Fatal("an HTTP client's connection refused was classified as a retryable database error")
	}
	if !IsUnavailable(fmt.Errorf("x: %w", Unavailable(refused))) || Unavailable(nil) != nil {
		t.Fatal("Unavailable not detected through wrapping")
	}
	// A client package marks its errors with a method instead of importing kafkatx.
	if !IsUnavailable(fmt.Errorf("x: %w", marked{true, nil})) || IsUnavailable(marked{false, nil}) || IsUnavailable(refused) {
		t.Fatal("the Unavailable() bool method is not honoured")
	}
	if !IsUnavailable(marked{false, marked{true, nil}}) {
		t.Fatal("an Unavailable() false error hides one that is unavailable below it")
	}
}

type marked struct {
	on    bool
	inner error
}

func (m marked) Error() string     { return "marked" }
func (m marked) Unavailable() bool { return m.on }
func (m marked) Unwrap() error     { return m.inner }
