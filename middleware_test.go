package kafkatx

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

type ctxMark struct{}

// Middleware runs in Config order (first = outermost) around the per-message Handler, which is
// adapted to a batch handler first; inside it GroupFromContext names the group, and a context
// a middleware attached to a message with SetContext reaches the handler.
func TestMiddlewareWrapsInOrderFirstOutermost(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, values(1, 0, func(int) string { return "one" }))
	var mu sync.Mutex
	var trace []string
	record := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		trace = append(trace, s)
	}
	named := func(name string) Middleware {
		return func(next BatchHandler) BatchHandler {
			return func(ctx context.Context, tx pgx.Tx, msgs []*Message) error {
				g, _ := GroupFromContext(ctx)
				record(fmt.Sprintf("%s> %d msgs group=%s", name, len(msgs), g))
				for _, m := range msgs {
					m.SetContext(context.WithValue(ctx, ctxMark{}, m.Context().Value(ctxMark{}).(string)+name))
				}
				err := next(ctx, tx, msgs)
				record("<" + name)
				return err
			}
		}
	}
	start := func(next BatchHandler) BatchHandler {
		return func(ctx context.Context, tx pgx.Tx, msgs []*Message) error {
			for _, m := range msgs {
				m.SetContext(context.WithValue(ctx, ctxMark{}, ""))
			}
			return next(ctx, tx, msgs)
		}
	}
	cfg := b.config(t)
	cfg.Middleware = []Middleware{start, named("a"), nil, named("b")}
	r := b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		record("handler " + m.Context().Value(ctxMark{}).(string))
		return applyEffect(ctx, tx, b.schema, m)
	}, cfg)
	waitFor(t, 60*time.Second, "the effect", func() bool { return b.q(t, "SELECT count(*) FROM {{schema}}.effects") == 1 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	want := []string{"a> 1 msgs group=" + b.group, "b> 1 msgs group=" + b.group, "handler ab", "<b", "<a"}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(trace, "|") != strings.Join(want, "|") {
		t.Fatalf("calls:\n%s\nwant:\n%s", strings.Join(trace, "\n"), strings.Join(want, "\n"))
	}
}

// A middleware's answers are the handler's: Permanent dead-letters at once, a plain error is
// retried as an attempt, a panic is recovered as an attempt (class panic) — for a batch
// handler too, where the middleware names the message with FailMessage.
func TestMiddlewareErrorsAndPanicsFollowTheHandlerRules(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, []testRecord{
		{key: []byte("k0"), value: []byte("ok-0")},
		{key: []byte("k1"), value: []byte("perm")},
		{key: []byte("k2"), value: []byte("flaky")},
		{key: []byte("k3"), value: []byte("panic")},
		{key: []byte("k4"), value: []byte("ok-4")},
	})
	var mu sync.Mutex
	flaky := 0
	guard := func(next BatchHandler) BatchHandler {
		return func(ctx context.Context, tx pgx.Tx, msgs []*Message) error {
			for _, m := range msgs {
				switch string(m.Value) {
				case "perm":
					return FailMessage(m, Permanent(errors.New("refused by middleware")))
				case "flaky":
					mu.Lock()
					flaky++
					n := flaky
					mu.Unlock()
					if m.Attempt == 1 {
						return FailMessage(m, fmt.Errorf("middleware: transient failure %d", n))
					}
				case "panic":
					if len(msgs) == 1 {
						panic("middleware panicked")
					}
					return FailMessage(m, errors.New("isolate me"))
				}
			}
			return next(ctx, tx, msgs)
		}
	}
	cfg := b.config(t)
	cfg.Retry.MaxAttempts = 3
	cfg.Middleware = []Middleware{guard}
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	c, err := NewBatchConsumer(b.pool, func(ctx context.Context, tx pgx.Tx, msgs []*Message) error {
		for _, m := range msgs {
			if err := applyEffect(ctx, tx, b.schema, m); err != nil {
				return err
			}
		}
		return nil
	}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := run(t, c)
	waitFor(t, 90*time.Second, "watermark past the 5 messages", func() bool {
		return b.q(t, "SELECT coalesce(sum(next_offset), 0) FROM {{schema}}.watermarks WHERE group_id = $1", b.group) == 5
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.effects WHERE convert_from(value, 'UTF8') IN ('ok-0', 'ok-4', 'flaky') AND applied = 1"); n != 3 {
		t.Fatalf("%d of ok-0, flaky, ok-4 applied once, want 3", n)
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.effects WHERE convert_from(value, 'UTF8') IN ('perm', 'panic')"); n != 0 {
		t.Fatalf("%d effects of the dead letters", n)
	}
	if n := b.q(t, `SELECT count(*) FROM {{schema}}.dead_letters WHERE "offset" = 1 AND error_class = 'permanent' AND attempts = 1 AND error_message = 'refused by middleware'`); n != 1 {
		t.Fatal("the middleware's Permanent error is not a permanent dead letter after one attempt")
	}
	if n := b.q(t, `SELECT count(*) FROM {{schema}}.dead_letters WHERE "offset" = 3 AND error_class = 'panic' AND attempts = 3 AND stack LIKE '%middleware_test.go%'`); n != 1 {
		t.Fatal("the middleware's panic is not a panic dead letter after 3 attempts with its stack")
	}
	if n := b.q(t, `SELECT count(*) FROM {{schema}}.dead_letters`); n != 2 {
		t.Fatalf("%d dead letters, want 2", n)
	}
	s := r.c.Stats()
	// flaky: one retry; panic: two retries (attempts 2 and 3).
	if s.DeadLettered != 2 || s.Retries != 3 || s.Processed != 3 {
		t.Fatalf("stats %+v: want 2 dead-lettered, 3 retries, 3 processed", s)
	}
	if got := testutil.ToFloat64(r.c.metrics.c.DeadLetters.WithLabelValues(b.group, b.topic, ErrorClassPanic)); got != 1 {
		t.Fatalf("kafkatx_dead_letters_total{error_class=panic} = %v, want 1", got)
	}
}

func TestChainOrder(t *testing.T) {
	var got []string
	mw := func(name string) Middleware {
		return func(next BatchHandler) BatchHandler {
			return func(ctx context.Context, tx pgx.Tx, msgs []*Message) error {
				got = append(got, name)
				return next(ctx, tx, msgs)
			}
		}
	}
	h, err := Chain(func(context.Context, pgx.Tx, []*Message) error { got = append(got, "h"); return nil }, mw("1"), mw("2"), mw("3"))
	if err != nil {
		t.Fatal(err)
	}
	if err := h(context.Background(), nil, nil); err != nil || strings.Join(got, "") != "123h" {
		t.Fatalf("order %v (%v), want 123h", got, err)
	}
	if _, ok := GroupFromContext(context.Background()); ok {
		t.Fatal("GroupFromContext outside a handler call reports a group")
	}
	var m Message
	if m.Context() != context.Background() {
		t.Fatal("a Message without SetContext has a context other than Background")
	}
}
