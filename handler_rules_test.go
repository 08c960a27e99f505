package kafkatx

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestHandlersOwnTimeoutIsAnAttemptEvenWhenPgxClosedTheConnection: a handler whose own
// context ends during a statement of the loop's transaction (pgx closes the connection then)
// has failed — an attempt, recorded on another connection, retried, dead-lettered at
// MaxAttempts — while a connection of the loop's transaction that is lost under a handler
// (here closed under it, an error that is not a PostgreSQL one) runs the transaction again
// without an attempt. Before, the first was re-run for ever at attempt 1 and the partition
// was stuck (the rules sorted any deadline and any net.Error as the loop's database).
func TestHandlersOwnTimeoutIsAnAttemptEvenWhenPgxClosedTheConnection(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, []testRecord{{value: []byte("sleep")}, {value: []byte("lost")}, {value: []byte("ok")}})
	var mu sync.Mutex
	calls := map[string][]int{} // value -> attempts of its calls
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		v := string(m.Value)
		mu.Lock()
		calls[v] = append(calls[v], m.Attempt)
		n := len(calls[v])
		mu.Unlock()
		if err := applyEffect(ctx, tx, b.schema, m); err != nil {
			return err
		}
		switch {
		case v == "sleep":
			c, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			_, err := tx.Exec(c, `SELECT pg_sleep(5)`)
			if !tx.Conn().IsClosed() {
				return fmt.Errorf("pg_sleep under a 100ms deadline: %v, and pgx kept the connection open: the test's premise is gone", err)
			}
			return fmt.Errorf("price lookup: %w", err)
		case v == "lost" && n == 1:
			_ = tx.Conn().PgConn().Conn().Close() // the network drops the loop's connection
			_, err := tx.Exec(ctx, `SELECT 1`)
			return fmt.Errorf("read stock: %w", err)
		}
		return nil
	}
	cfg := b.config(t)
	cfg.Retry.MaxAttempts = 2
	b.start(t, h, cfg)
	waitFor(t, 60*time.Second, "watermark 3", func() bool {
		return b.q(t, "SELECT coalesce(max(next_offset), 0) FROM {{schema}}.watermarks") == 3
	})
	mu.Lock()
	defer mu.Unlock()
	if got := fmt.Sprint(calls["sleep"]); got != "[1 2]" {
		t.Errorf("the handler timing itself out ran at attempts %s, want [1 2] then its dead letter", got)
	}
	if got := calls["lost"]; len(got) < 2 || got[len(got)-1] != 1 {
		t.Errorf("the message whose loop connection was lost ran at attempts %v, want a re-run at attempt 1", got)
	}
	if n := b.q(t, `SELECT count(*) FROM {{schema}}.dead_letters WHERE "offset" = 0 AND attempts = 2 AND error_class = 'handler' AND error_message LIKE 'price lookup: %'`); n != 1 {
		var msg string
		_ = b.pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT coalesce(string_agg(error_class || ' ' || attempts || ' ' || error_message, '; '), '') FROM %s`,
			pgx.Identifier{b.schema, "dead_letters"}.Sanitize())).Scan(&msg)
		t.Errorf("no dead letter of the timed-out message after 2 attempts; dead letters: %q", msg)
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.dead_letters"); n != 1 {
		t.Errorf("%d dead letters, want 1 (the lost connection is not the message's failure)", n)
	}
	if n := b.q(t, `SELECT count(*) FROM {{schema}}.effects WHERE applied = 1 AND "offset" IN (1, 2)`); n != 2 {
		t.Errorf("%d of the 2 effects after the lost connection committed once", n)
	}
	if n := b.q(t, `SELECT count(*) FROM {{schema}}.effects WHERE "offset" = 0`); n != 0 {
		t.Errorf("the dead-lettered message's effect committed")
	}
}

// TestHandlerCommittingTheLoopsTransactionIsRefused: Commit and Rollback on the handler's tx
// return ErrTxOwnedByLoop and do nothing; the try is the handler's failure, dead-lettered
// after MaxAttempts, and no effect of it commits — also when the handler ignores the error
// and returns nil. Before, the handler's Commit committed its effects, the loop's statements
// then failed with "tx is closed" and the loop re-ran the message for ever, committing the
// effects again each time.
func TestHandlerCommittingTheLoopsTransactionIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, []testRecord{{value: []byte("commit")}, {value: []byte("commit-ignored")}, {value: []byte("rollback-ignored")}, {value: []byte("ok")}})
	var mu sync.Mutex
	calls := map[string]int{}
	var refusals []error
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		v := string(m.Value)
		mu.Lock()
		calls[v]++
		mu.Unlock()
		if err := applyEffect(ctx, tx, b.schema, m); err != nil {
			return err
		}
		var err error
		switch v {
		case "commit":
			return tx.Commit(ctx)
		case "commit-ignored":
			err = tx.Commit(ctx)
		case "rollback-ignored":
			err = tx.Rollback(ctx)
		}
		if err != nil {
			mu.Lock()
			refusals = append(refusals, err)
			mu.Unlock()
		}
		return nil
	}
	cfg := b.config(t)
	cfg.Retry.MaxAttempts = 2
	b.start(t, h, cfg)
	waitFor(t, 60*time.Second, "watermark 4", func() bool {
		return b.q(t, "SELECT coalesce(max(next_offset), 0) FROM {{schema}}.watermarks") == 4
	})
	time.Sleep(200 * time.Millisecond) // a loop that went on re-running would show in calls
	mu.Lock()
	defer mu.Unlock()
	for _, v := range []string{"commit", "commit-ignored", "rollback-ignored"} {
		if calls[v] > 4 {
			t.Errorf("%q ran %d times; want its 2 attempts (and at most 2 tries in a batch)", v, calls[v])
		}
	}
	for _, err := range refusals {
		if !strings.Contains(err.Error(), "belongs to the consumer loop") {
			t.Errorf("the handler's Commit or Rollback answered %v", err)
		}
	}
	if n := b.q(t, `SELECT count(*) FROM {{schema}}.dead_letters WHERE attempts = 2 AND error_message LIKE '%belongs to the consumer loop%'`); n != 3 {
		t.Errorf("%d dead letters saying the loop owns the transaction, want 3", n)
	}
	if n := b.q(t, `SELECT count(*) FROM {{schema}}.effects`); n != 1 {
		t.Errorf("%d effects committed, want 1 (only ok's)", n)
	}
}

// TestPanickingConfigCallbacksDoNotEndTheProcess: a Config.DeadLetter.Topic that panics leaves
// the partition waiting on the dead letter (logged, tried again), the process alive and
// nothing committed; a middleware that panics while wrapping, or wraps into nil, is
// NewConsumer's error. Before, the first ended the process from the worker goroutine and the
// second panicked in NewConsumer (or on every call).
func TestPanickingConfigCallbacksDoNotEndTheProcess(t *testing.T) {
	t.Parallel()
	nop := func(ctx context.Context, tx pgx.Tx, m *Message) error { return nil }
	boom := func(next BatchHandler) BatchHandler { panic("middleware constructor") }
	none := func(next BatchHandler) BatchHandler { return nil }
	for _, mws := range [][]Middleware{{boom}, {nil, none}} {
		if _, err := NewConsumer(new(pgxpool.Pool), nop, &Config{Kafka: kafka.ConfigMap{"bootstrap.servers": "x", "group.id": "g"}, Topics: []string{"t"}, Middleware: mws}); err == nil ||
			!strings.Contains(err.Error(), "Config.Middleware[") {
			t.Errorf("NewConsumer with a bad middleware: %v", err)
		}
	}

	b := setup(t, 1)
	produce(t, b.brokers, b.topic, []testRecord{{value: []byte("bad")}})
	var calls atomic.Int32
	cfg := b.config(t)
	cfg.DeadLetter.Topic = func(topic string) string { calls.Add(1); panic("no dead-letter topic for " + topic) }
	r := b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error { return Permanent(errors.New("bad order")) }, cfg)
	waitFor(t, 60*time.Second, "the dead-letter topic asked twice", func() bool { return calls.Load() >= 2 })
	if err := r.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.dead_letters") + b.q(t, "SELECT coalesce(max(next_offset), 0) FROM {{schema}}.watermarks"); n != 0 {
		t.Fatalf("a dead letter or watermark advance committed without its dead-letter topic")
	}
}
