package kafkatxtest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/dlq"
	"github.com/kafkatx/kafkatx/idempotency"
	"github.com/kafkatx/kafkatx/kafkatxtest"
	"github.com/kafkatx/kafkatx/outbox"
)

// setup returns a kit on DATABASE_URL with an effects table in the test's schema (created
// with an unqualified name: the kit's pool has the schema first on its search_path).
func setup(t *testing.T, cfg *kafkatx.Config) *kafkatxtest.Kit {
	t.Helper()
	k := kafkatxtest.New(t, &kafkatxtest.Options{Config: cfg})
	if _, err := k.Pool().Exec(context.Background(), `CREATE TABLE effects (v text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	return k
}

// handler writes its value as an effect, then fails as its value says.
func handler(ctx context.Context, tx pgx.Tx, m *kafkatx.Message) error {
	if _, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1)`, string(m.Value)); err != nil {
		return err
	}
	switch v := string(m.Value); {
	case strings.HasPrefix(v, "permanent"):
		return kafkatx.Permanent(errors.New("bad order"))
	case strings.HasPrefix(v, "fail"):
		return errors.New("downstream said no")
	case strings.HasPrefix(v, "panic"):
		panic("nil map somewhere")
	case strings.HasPrefix(v, "unavailable"):
		return kafkatx.Unavailable(errors.New("API refuses our token"))
	case strings.HasPrefix(v, "serialization"):
		return fmt.Errorf("update: %w", &pgconn.PgError{Code: "40001", Message: "could not serialize access"})
	}
	return nil
}

func effects(t *testing.T, tx *kafkatxtest.Tx) []string {
	t.Helper()
	rows, err := tx.Query(context.Background(), `SELECT v FROM effects ORDER BY v`)
	if err != nil {
		t.Fatal(err)
	}
	vs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return vs
}

func kinds(os []kafkatxtest.Outcome) string {
	s := make([]string, len(os))
	for i, o := range os {
		s[i] = o.Kind.String()
	}
	return strings.Join(s, " ")
}

func TestOutcomesOfOneTryEach(t *testing.T) {
	t.Parallel()
	k := setup(t, nil)
	msgs := kafkatxtest.Messages("orders", "ok-0", "permanent-1", "fail-2", "panic-3", "unavailable-4", "ok-5", "serialization-6", "ok-7", "ok-8")
	tx := k.Run(handler, msgs[:4]...)
	// An Unavailable answer or a retryable database error holds the whole try, as in the
	// loop: it is rolled back and run again, the messages after it included.
	tx.Run(handler, msgs[4:6]...)
	tx.Run(handler, msgs[6:8]...)
	tx.Run(handler, msgs[8])
	if got, want := kinds(tx.Outcomes()), "committed dead-lettered retried retried unavailable unavailable run-again run-again committed"; got != want {
		t.Fatalf("outcomes %q, want %q\n%v", got, want, tx.Outcomes())
	}
	// A failed try's writes are rolled back; the committed ones stay in the transaction.
	if got := strings.Join(effects(t, tx), ","); got != "ok-0,ok-8" {
		t.Errorf("effects %s, want ok-0,ok-8", got)
	}
	if o := tx.Outcome(1); o.ErrorClass != kafkatx.ErrorClassPermanent || o.ErrorMessage != "bad order" || o.DeadLetter == nil || o.DeadLetter.ID == 0 {
		t.Errorf("permanent: %+v", o)
	}
	if o := tx.Outcome(2); o.ErrorClass != kafkatx.ErrorClassHandler || o.Attempt != 1 || o.DeadLetter != nil {
		t.Errorf("ordinary failure at attempt 1: %+v", o)
	}
	if o := tx.Outcome(3); o.ErrorClass != kafkatx.ErrorClassPanic || !strings.Contains(o.Stack, "kafkatxtest_test.handler") || o.ErrorMessage != "handler panicked: nil map somewhere" {
		t.Errorf("panic: class %q message %q stack %q", o.ErrorClass, o.ErrorMessage, o.Stack)
	}
	if o := tx.Outcome(4); !kafkatx.IsUnavailable(o.Err) || o.ErrorClass != "" {
		t.Errorf("unavailable: %+v", o)
	}
	ds := tx.DeadLetters()
	if len(ds) != 1 || ds[0].Offset != 1 || ds[0].Group != kafkatxtest.DefaultGroup || string(ds[0].Value) != "permanent-1" || ds[0].Attempts != 1 {
		t.Fatalf("dead letters %+v, want the permanent one only", ds)
	}
	recs := tx.Outbox()
	if len(recs) != 1 || recs[0].Topic != "orders.dlq" || string(recs[0].Value) != "permanent-1" {
		t.Fatalf("outbox %+v, want the dead letter's record for orders.dlq", recs)
	}
	if h := header(recs[0].Record, dlq.HeaderErrorClass); h != kafkatx.ErrorClassPermanent {
		t.Errorf("dead letter record's %s header %q", dlq.HeaderErrorClass, h)
	}
}

func header(r outbox.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// TestAttemptsAgainstMaxAttempts: an ordinary failure or a panic is retried below
// Config.Retry.MaxAttempts and dead-lettered at it.
func TestAttemptsAgainstMaxAttempts(t *testing.T) {
	t.Parallel()
	k := setup(t, &kafkatx.Config{Retry: kafkatx.RetryPolicy{MaxAttempts: 3}, DeadLetter: kafkatx.DeadLetterConfig{Disabled: true}})
	for _, tc := range []struct {
		value   string
		attempt int
		want    kafkatxtest.Kind
	}{
		{"fail", 1, kafkatxtest.Retried}, {"fail", 2, kafkatxtest.Retried}, {"fail", 3, kafkatxtest.DeadLettered}, {"fail", 7, kafkatxtest.DeadLettered},
		{"panic", 2, kafkatxtest.Retried}, {"panic", 3, kafkatxtest.DeadLettered}, {"permanent", 1, kafkatxtest.DeadLettered},
	} {
		m := kafkatxtest.NewMessage("t", 2, 40, []byte("k"), []byte(tc.value), kafkatxtest.Header("h", "v"))
		m.Attempt = tc.attempt
		tx := k.Run(handler, m)
		o := tx.Outcome(40)
		if o.Kind != tc.want || o.Attempt != tc.attempt {
			t.Errorf("%s at attempt %d: %v, want %v", tc.value, tc.attempt, o, tc.want)
			continue
		}
		if tc.want == kafkatxtest.DeadLettered {
			ds := tx.DeadLetters()
			if len(ds) != 1 || ds[0].Attempts != tc.attempt || ds[0].Partition != 2 || string(ds[0].Key) != "k" || len(ds[0].Headers) != 1 || string(ds[0].Headers[0].Value) != "v" {
				t.Errorf("%s at attempt %d: dead letters %+v", tc.value, tc.attempt, ds)
			}
			if recs := tx.Outbox(); len(recs) != 0 {
				t.Errorf("DeadLetter.Disabled: outbox %+v, want none", recs)
			}
		}
		// The next case dead-letters the same offset: a second open transaction writing the
		// row would wait for this one (kafkatxtest.LockTimeout).
		if err := tx.Rollback(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestBatchIsolatesTheFailingMessage: a batch failure naming its message (FailMessage)
// re-runs the others without it; one naming none runs them one per try.
func TestBatchIsolatesTheFailingMessage(t *testing.T) {
	t.Parallel()
	k := setup(t, nil)
	var calls []int
	named := func(ctx context.Context, tx pgx.Tx, msgs []*kafkatx.Message) error {
		calls = append(calls, len(msgs))
		for _, m := range msgs {
			if _, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1)`, string(m.Value)); err != nil {
				return err
			}
			if string(m.Value) == "bad" {
				return kafkatx.FailMessage(m, kafkatx.Permanent(errors.New("cannot parse")))
			}
		}
		return nil
	}
	tx := k.RunBatch(named, kafkatxtest.Messages("t", "a", "b", "bad", "c", "d")...)
	if got, want := kinds(tx.Outcomes()), "committed committed dead-lettered committed committed"; got != want {
		t.Fatalf("outcomes %q, want %q", got, want)
	}
	if fmt.Sprint(calls) != "[5 2 2]" {
		t.Errorf("batch sizes %v, want [5 2 2]: the whole batch, the two before the failure, the two after", calls)
	}
	if got := strings.Join(effects(t, tx), ","); got != "a,b,c,d" {
		t.Errorf("effects %s", got)
	}

	calls = nil
	unnamed := func(ctx context.Context, tx pgx.Tx, msgs []*kafkatx.Message) error {
		calls = append(calls, len(msgs))
		for _, m := range msgs {
			if string(m.Value) == "bad" {
				return errors.New("something in this batch")
			}
		}
		return nil
	}
	tx = k.RunBatch(unnamed, kafkatxtest.Messages("t", "a", "bad", "c")...)
	if got, want := kinds(tx.Outcomes()), "committed retried committed"; got != want {
		t.Fatalf("unattributed: outcomes %q, want %q", got, want)
	}
	if fmt.Sprint(calls) != "[3 1 1 1]" {
		t.Errorf("unattributed: batch sizes %v, want [3 1 1 1]", calls)
	}
	if o := tx.Outcome(1); o.ErrorMessage != "something in this batch" {
		t.Errorf("unattributed: %v", o)
	}
}

// TestIdempotencyClaims: a business key claimed before skips its message, in one run and
// across runs in one transaction; ErrNotAChange skips without a claim; a key function error
// is a permanent failure.
func TestIdempotencyClaims(t *testing.T) {
	t.Parallel()
	k := setup(t, &kafkatx.Config{Idempotency: kafkatx.IdempotencyConfig{Key: func(m idempotency.Message) (string, bool, error) {
		switch string(m.Value) {
		case "heartbeat":
			return "", false, idempotency.ErrNotAChange
		case "broken":
			return "", false, errors.New("no order id")
		}
		return idempotency.FromHeader("idempotency-key")(m)
	}}})
	msgs := []*kafkatx.Message{
		kafkatxtest.NewMessage("t", 0, 0, nil, []byte("first"), kafkatxtest.Header("idempotency-key", "A")),
		kafkatxtest.NewMessage("t", 0, 1, nil, []byte("again"), kafkatxtest.Header("idempotency-key", "A")),
		kafkatxtest.NewMessage("t", 0, 2, nil, []byte("heartbeat")),
		kafkatxtest.NewMessage("t", 0, 3, nil, []byte("no-key")),
		kafkatxtest.NewMessage("t", 0, 4, nil, []byte("broken")),
	}
	tx := k.Run(handler, msgs...)
	if got, want := kinds(tx.Outcomes()), "committed duplicate not-a-change committed dead-lettered"; got != want {
		t.Fatalf("outcomes %q, want %q", got, want)
	}
	if o := tx.Outcome(4); o.ErrorClass != kafkatx.ErrorClassPermanent || !strings.Contains(o.ErrorMessage, "no order id") {
		t.Errorf("key function error: %v", o)
	}
	redelivered := kafkatxtest.NewMessage("t", 1, 9, nil, []byte("later"), kafkatxtest.Header("idempotency-key", "A"))
	if o := tx.Run(handler, redelivered); o[0].Kind != kafkatxtest.Duplicate {
		t.Errorf("a later run in the same transaction: %v, want duplicate", o[0])
	}
	if got := strings.Join(effects(t, tx), ","); got != "first,no-key" {
		t.Errorf("effects %s", got)
	}
}

// TestSchemaIsFreshAndDropped: each kit has its own migrated schema, gone after its test; the
// transaction is rolled back.
func TestSchemaIsFreshAndDropped(t *testing.T) {
	t.Parallel()
	var schema string
	outer := kafkatxtest.New(t, nil)
	t.Run("inner", func(t *testing.T) {
		k := setup(t, nil)
		schema = k.Schema()
		if schema == outer.Schema() {
			t.Fatal("two kits share a schema")
		}
		k.Run(handler, kafkatxtest.Messages("t", "ok")...)
	})
	var n int
	if err := outer.Pool().QueryRow(context.Background(), `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, schema).Scan(&n); err != nil || n != 0 {
		t.Fatalf("schema %s still there after its test (%d, %v)", schema, n, err)
	}
	// The outer kit's schema is migrated: the dead-letter table is there and empty.
	tx := outer.Begin()
	if ds := tx.DeadLetters(); len(ds) != 0 {
		t.Fatalf("fresh schema holds dead letters %+v", ds)
	}
}

// Config.Middleware wraps the handler as in the loop, outermost first: a middleware's
// Permanent answer dead-letters, and what it writes is part of the try.
func TestMiddlewareRunsAroundTheHandler(t *testing.T) {
	t.Parallel()
	var order []string
	mw := func(name string, refuse string) kafkatx.Middleware {
		return func(next kafkatx.BatchHandler) kafkatx.BatchHandler {
			return func(ctx context.Context, tx pgx.Tx, msgs []*kafkatx.Message) error {
				order = append(order, name)
				for _, m := range msgs {
					if string(m.Value) == refuse {
						return kafkatx.FailMessage(m, kafkatx.Permanent(errors.New("refused by "+name)))
					}
				}
				return next(ctx, tx, msgs)
			}
		}
	}
	k := setup(t, &kafkatx.Config{Middleware: []kafkatx.Middleware{mw("outer", ""), mw("inner", "ok-1")}})
	tx := k.RunBatch(func(ctx context.Context, tx pgx.Tx, msgs []*kafkatx.Message) error {
		order = append(order, "handler")
		return handler(ctx, tx, msgs[0])
	}, kafkatxtest.Messages("orders", "ok-0", "ok-1")...)
	if got, want := kinds(tx.Outcomes()), "committed dead-lettered"; got != want {
		t.Fatalf("outcomes %q, want %q", got, want)
	}
	if o := tx.Outcome(1); o.ErrorMessage != "refused by inner" {
		t.Errorf("dead letter message %q, want the middleware's", o.ErrorMessage)
	}
	if len(order) < 3 || order[0] != "outer" || order[1] != "inner" {
		t.Errorf("call order %v, want outer, inner, ... (first middleware outermost)", order)
	}
}
