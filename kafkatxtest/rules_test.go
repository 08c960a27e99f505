package kafkatxtest_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/kafkatxtest"
	"github.com/kafkatx/kafkatx/outbox"
)

// recorder is a testing.TB that records Error, Errorf, Fatal and Fatalf instead of failing
// the test (Fatal ends the goroutine, as testing's does): for the kit's own refusals.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	failed []string
}

func (r *recorder) add(s string)              { r.mu.Lock(); r.failed = append(r.failed, s); r.mu.Unlock() }
func (r *recorder) Error(a ...any)            { r.add(fmt.Sprint(a...)) }
func (r *recorder) Errorf(f string, a ...any) { r.add(fmt.Sprintf(f, a...)) }
func (r *recorder) Fatal(a ...any)            { r.add(fmt.Sprint(a...)); runtime.Goexit() }
func (r *recorder) Fatalf(f string, a ...any) { r.add(fmt.Sprintf(f, a...)); runtime.Goexit() }

// do runs f on a goroutine of its own, so that a Fatal ends f only, and returns what failed.
func (r *recorder) do(f func()) []string {
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	<-done
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.failed
	r.failed = nil
	return out
}

// TestKitRefusesANilHandler as kafkatx.NewConsumer does ("kafkatx: nil Handler"). Before, the
// kit ran a nil handler and reported its nil dereference as a handler panic, an attempt.
func TestKitRefusesANilHandler(t *testing.T) {
	t.Parallel()
	r := &recorder{TB: t}
	k := kafkatxtest.New(r, nil)
	msgs := kafkatxtest.Messages("orders", "a")
	for name, f := range map[string]func(){
		"Kit.Run":      func() { k.Run(nil, msgs...) },
		"Kit.RunBatch": func() { k.RunBatch(nil, msgs...) },
		"Tx.Run":       func() { k.Begin().Run(nil, msgs...) },
		"Tx.RunBatch":  func() { k.Begin().RunBatch(nil, msgs...) },
	} {
		got := r.do(f)
		if len(got) != 1 || !strings.Contains(got[0], "nil Handler") && !strings.Contains(got[0], "nil BatchHandler") {
			t.Errorf("%s(nil): failed with %q, want the kit's refusal of a nil handler", name, got)
		}
	}
	if _, err := kafkatx.NewConsumer(k.Pool(), nil, nil); err == nil || err.Error() != "kafkatx: nil Handler" {
		t.Errorf("NewConsumer(nil handler) = %v; the kit's message quotes it", err)
	}
}

// TestKitSortsTheHandlersOwnTimeoutAndALostConnectionAsTheLoopDoes: a handler whose own
// deadline ends a statement (pgx closes the connection) has failed (Retried, an attempt);
// the transaction's connection dropped under the handler is RunAgain. Before, both were
// RunAgain (any deadline counted as the loop's database).
func TestKitSortsTheHandlersOwnTimeoutAndALostConnectionAsTheLoopDoes(t *testing.T) {
	t.Parallel()
	k := setup(t, nil)
	tx := k.Run(func(ctx context.Context, tx pgx.Tx, m *kafkatx.Message) error {
		c, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		_, err := tx.Exec(c, `SELECT pg_sleep(5)`)
		return err
	}, kafkatxtest.Messages("orders", "sleep")...)
	if o := tx.Outcome(0); o.Kind != kafkatxtest.Retried || o.ErrorClass != kafkatx.ErrorClassHandler {
		t.Errorf("own deadline during a statement: %v, want retried (handler)", o)
	}
	tx = k.Run(func(ctx context.Context, tx pgx.Tx, m *kafkatx.Message) error {
		_ = tx.Conn().PgConn().Conn().Close()
		_, err := tx.Exec(ctx, `SELECT 1`)
		return err
	}, kafkatxtest.Messages("orders", "lost")...)
	if o := tx.Outcome(0); o.Kind != kafkatxtest.RunAgain {
		t.Errorf("the transaction's connection lost: %v, want run-again", o)
	}
}

// TestKitOutboxReportsRecordsWrittenToTheDefaultSchema: code under test that writes with
// outbox.Writer{} (schema "kafkatx") where a kafkatx schema exists puts its record in that
// table, not the kit's; Tx.Outbox fails the test saying so instead of returning nothing.
func TestKitOutboxReportsRecordsWrittenToTheDefaultSchema(t *testing.T) {
	t.Parallel()
	r := &recorder{TB: t}
	k := kafkatxtest.New(r, nil)
	tx := k.Begin()
	ctx := t.Context()
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass('kafkatx.outbox') IS NOT NULL`).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if !exists { // made in the test's transaction, rolled back with it
		if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS kafkatx; CREATE TABLE kafkatx.outbox (LIKE `+
			pgx.Identifier{k.Schema(), "outbox"}.Sanitize()+` INCLUDING ALL)`); err != nil {
			t.Fatal(err)
		}
	}
	tx.Run(func(ctx context.Context, tx pgx.Tx, m *kafkatx.Message) error {
		_, err := outbox.Writer{}.WriteTx(ctx, tx, outbox.Record{Topic: "orders.priced", Value: m.Value})
		return err
	}, kafkatxtest.Messages("orders", "a")...)
	var recs []kafkatxtest.OutboxRecord
	got := r.do(func() { recs = tx.Outbox() })
	if len(got) != 1 || !strings.Contains(got[0], `outbox.Writer{Schema: k.Schema()}`) || len(recs) != 0 {
		t.Errorf("Tx.Outbox after a write to the default schema: failures %q, records %v; want one failure naming k.Schema()", got, recs)
	}
	tx.Run(func(ctx context.Context, tx pgx.Tx, m *kafkatx.Message) error {
		_, err := outbox.Writer{Schema: k.Schema()}.WriteTx(ctx, tx, outbox.Record{Topic: "orders.priced", Value: m.Value})
		return err
	}, kafkatxtest.NewMessage("orders", 0, 1, nil, []byte("b")))
	_ = tx.Rollback(ctx)
	tx = k.Run(func(ctx context.Context, tx pgx.Tx, m *kafkatx.Message) error {
		_, err := outbox.Writer{Schema: k.Schema()}.WriteTx(ctx, tx, outbox.Record{Topic: "orders.priced", Value: m.Value})
		return err
	}, kafkatxtest.Messages("orders", "c")...)
	if got := r.do(func() { recs = tx.Outbox() }); len(got) != 0 || len(recs) != 1 {
		t.Errorf("Tx.Outbox after a write to the kit's schema: failures %q, %d records, want none and 1", got, len(recs))
	}
}

// TestKitRefusesTheHandlersCommitAndKeepsItsSavepoints: the handler's tx refuses Commit and
// Rollback (kafkatx.ErrTxOwnedByLoop, the try fails); tx.Begin still opens a savepoint.
func TestKitRefusesTheHandlersCommitAndKeepsItsSavepoints(t *testing.T) {
	t.Parallel()
	k := setup(t, nil)
	var answer error
	tx := k.Run(func(ctx context.Context, tx pgx.Tx, m *kafkatx.Message) error {
		if _, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1)`, string(m.Value)); err != nil {
			return err
		}
		switch string(m.Value) {
		case "commit":
			answer = tx.Commit(ctx)
			return answer
		case "ignored":
			_ = tx.Rollback(ctx)
		case "savepoint":
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := sp.Exec(ctx, `INSERT INTO effects VALUES ('in-savepoint')`); err != nil {
				return err
			}
			return sp.Commit(ctx)
		}
		return nil
	}, kafkatxtest.Messages("orders", "commit", "ignored", "savepoint")...)
	if answer != kafkatx.ErrTxOwnedByLoop {
		t.Errorf("the handler's Commit answered %v, want kafkatx.ErrTxOwnedByLoop", answer)
	}
	if got := kinds(tx.Outcomes()); got != "retried retried committed" {
		t.Errorf("outcomes %s (%v), want retried retried committed", got, tx.Outcomes())
	}
	if got := strings.Join(effects(t, tx), ","); got != "in-savepoint,savepoint" {
		t.Errorf("effects %s, want in-savepoint,savepoint", got)
	}
}

// TestKitFailsTheTestOnPanickingConfigCallbacks: a middleware that panics while wrapping and a
// dead-letter topic function that panics fail the test with what panicked, as NewConsumer and
// the loop refuse them; before, the panic ended the test binary.
func TestKitFailsTheTestOnPanickingConfigCallbacks(t *testing.T) {
	t.Parallel()
	r := &recorder{TB: t}
	k := kafkatxtest.New(r, &kafkatxtest.Options{Config: &kafkatx.Config{Middleware: []kafkatx.Middleware{
		func(next kafkatx.BatchHandler) kafkatx.BatchHandler { panic("middleware constructor") }}}})
	nop := func(ctx context.Context, tx pgx.Tx, m *kafkatx.Message) error { return nil }
	if got := r.do(func() { k.Run(nop, kafkatxtest.Messages("orders", "a")...) }); len(got) != 1 || !strings.Contains(got[0], "Config.Middleware[0] panicked") {
		t.Errorf("a panicking middleware constructor: %q", got)
	}
	k = kafkatxtest.New(r, &kafkatxtest.Options{Config: &kafkatx.Config{DeadLetter: kafkatx.DeadLetterConfig{
		Topic: func(string) string { panic("no topic") }}}})
	bad := func(ctx context.Context, tx pgx.Tx, m *kafkatx.Message) error {
		return kafkatx.Permanent(errors.New("bad"))
	}
	if got := r.do(func() { k.Run(bad, kafkatxtest.Messages("orders", "a")...) }); len(got) != 1 || !strings.Contains(got[0], "Config.DeadLetter.Topic panicked") {
		t.Errorf("a panicking dead-letter topic function: %q", got)
	}
}

type preparedKey struct{}

// TestKitRunsConfigPrepareBeforeTheTry as the loop runs it before each transaction: its result
// reaches the handler through the message's context; its Unavailable answer is the batch's
// (no attempt); its failure naming a message is that message's attempt.
func TestKitRunsConfigPrepareBeforeTheTry(t *testing.T) {
	t.Parallel()
	prepare := func(ctx context.Context, msgs []*kafkatx.Message) error {
		for _, m := range msgs {
			switch string(m.Value) {
			case "down":
				return kafkatx.Unavailable(errors.New("service down"))
			case "bad":
				return kafkatx.FailMessage(m, errors.New("refused"))
			}
			m.SetContext(context.WithValue(m.Context(), preparedKey{}, "called:"+string(m.Value)))
		}
		return nil
	}
	k := kafkatxtest.New(t, &kafkatxtest.Options{Config: &kafkatx.Config{Prepare: prepare}})
	var seen []string
	h := func(ctx context.Context, tx pgx.Tx, m *kafkatx.Message) error {
		v, _ := m.Context().Value(preparedKey{}).(string)
		seen = append(seen, v)
		return nil
	}
	if out := k.Run(h, kafkatxtest.Messages("t", "a", "b")...).Outcomes(); len(out) != 2 || out[0].Kind != kafkatxtest.Committed || strings.Join(seen, ",") != "called:a,called:b" {
		t.Fatalf("prepared run: %v, handler saw %v", out, seen)
	}
	if out := k.Run(h, kafkatxtest.Messages("t", "down")...).Outcomes(); len(out) != 1 || out[0].Kind != kafkatxtest.Unavailable {
		t.Fatalf("prepare answered Unavailable: %v", out)
	}
	if out := k.Run(h, kafkatxtest.Messages("t", "ok", "bad")...).Outcomes(); len(out) != 2 || out[0].Kind != kafkatxtest.Committed || out[1].Kind != kafkatxtest.Retried {
		t.Fatalf("prepare failed naming the second message: %v", out)
	}
}
