package kafkatxtest_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/dlq"
	"github.com/kafkatx/kafkatx/idempotency"
	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/kafkatxtest"
)

// TestTheKitAgreesWithTheLoop runs one handler over the same six records twice: through a
// real Consumer on the real broker, and through the kit, re-running each message the kit
// reports Retried at its next attempt, as the loop does. Both must end with the same dead
// letters (offset, class, attempts, message) and the same committed effects — a permanent
// failure, a failure and a panic at every try, a duplicate business key.
func TestTheKitAgreesWithTheLoop(t *testing.T) {
	t.Parallel()
	recs := []agreeRecord{{"ok-0", "A"}, {"permanent-1", ""}, {"fail-2", ""}, {"panic-3", ""}, {"ok-4", "A"}, {"ok-5", "B"}}
	cfg := func() *kafkatx.Config {
		return &kafkatx.Config{
			Retry:       kafkatx.RetryPolicy{MaxAttempts: 2, InitialBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond},
			Idempotency: kafkatx.IdempotencyConfig{Key: idempotency.FromHeader("idempotency-key")},
		}
	}
	loopDLs, kitDLs, loopEffects, kitEffects := runLoopAndKit(t, recs, handler, cfg)
	if l, k := describeDLs(loopDLs), describeDLs(kitDLs); !slices.Equal(l, k) || len(l) != 3 {
		t.Errorf("dead letters differ:\nloop %s\nkit  %s", strings.Join(l, "\n     "), strings.Join(k, "\n     "))
	}
	if !slices.Equal(loopEffects, kitEffects) || strings.Join(kitEffects, ",") != "ok-0,ok-5" {
		t.Errorf("effects differ: loop %v, kit %v; want ok-0,ok-5 (ok-4 a duplicate of ok-0's key)", loopEffects, kitEffects)
	}
	for _, d := range kitDLs {
		if d.ErrorClass == kafkatx.ErrorClassPanic && !strings.Contains(d.Stack, "kafkatxtest_test.handler") {
			t.Errorf("the kit's panic dead letter has no stack of the handler: %q", d.Stack)
		}
	}
}

// TestTheKitAgreesWithTheLoopOnTheHandlersOwnFailures: a handler's own timeout, its own
// cancellation, its own network error, a Commit or Rollback of the loop's transaction (even
// one whose error the handler ignores) and a panicking idempotency key function are the
// message's failures in both — attempts, dead-lettered at MaxAttempts with the same class and
// message — and never commit an effect. Before, the loop re-ran the first three for ever
// (no attempt), committed the Commit's effects and then re-ran them for ever, and a key
// function's panic ended the process.
func TestTheKitAgreesWithTheLoopOnTheHandlersOwnFailures(t *testing.T) {
	t.Parallel()
	recs := []agreeRecord{{"deadline-0", ""}, {"canceled-1", ""}, {"dial-2", ""}, {"commit-3", ""}, {"commitnil-4", ""},
		{"rollbacknil-5", ""}, {"keypanic-6", ""}, {"savepoint-7", ""}, {"ok-8", ""}}
	cfg := func() *kafkatx.Config {
		return &kafkatx.Config{
			Retry: kafkatx.RetryPolicy{MaxAttempts: 2, InitialBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond},
			Idempotency: kafkatx.IdempotencyConfig{Key: func(m idempotency.Message) (string, bool, error) {
				if strings.HasPrefix(string(m.Value), "keypanic") {
					panic("key function: nil map")
				}
				return "", false, nil
			}},
		}
	}
	h := func(ctx context.Context, tx pgx.Tx, m *kafkatx.Message) error {
		v := string(m.Value)
		if _, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1)`, v); err != nil {
			return err
		}
		switch {
		case strings.HasPrefix(v, "deadline"):
			c, cancel := context.WithTimeout(ctx, time.Millisecond)
			defer cancel()
			<-c.Done()
			return fmt.Errorf("call pricing API: %w", c.Err())
		case strings.HasPrefix(v, "canceled"):
			return context.Canceled
		case strings.HasPrefix(v, "dial"):
			d := net.Dialer{Timeout: time.Nanosecond}
			_, err := d.DialContext(ctx, "tcp", "10.255.255.1:80")
			if err == nil {
				return errors.New("dial did not fail")
			}
			return fmt.Errorf("call pricing API: %w", err)
		case strings.HasPrefix(v, "commitnil"):
			_ = tx.Commit(ctx)
		case strings.HasPrefix(v, "commit"):
			return tx.Commit(ctx)
		case strings.HasPrefix(v, "rollbacknil"):
			_ = tx.Rollback(ctx)
		case strings.HasPrefix(v, "savepoint"):
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := sp.Exec(ctx, `INSERT INTO effects VALUES ($1)`, v+"-in-savepoint"); err != nil {
				return err
			}
			return sp.Commit(ctx)
		}
		return nil
	}
	loopDLs, kitDLs, loopEffects, kitEffects := runLoopAndKit(t, recs, h, cfg)
	l, k := describeDLs(loopDLs), describeDLs(kitDLs)
	if !slices.Equal(l, k) || len(l) != 7 {
		t.Errorf("dead letters differ or are not 7:\nloop %s\nkit  %s", strings.Join(l, "\n     "), strings.Join(k, "\n     "))
	}
	for _, d := range append(loopDLs, kitDLs...) {
		want := kafkatx.ErrorClassHandler
		if d.Offset == 6 {
			want = kafkatx.ErrorClassPanic
			if !strings.Contains(d.Stack, "TestTheKitAgreesWithTheLoopOnTheHandlersOwnFailures") {
				t.Errorf("the key function's panic dead letter has no stack of it: %q", d.Stack)
			}
		}
		if d.ErrorClass != want || d.Attempts != 2 {
			t.Errorf("dead letter of offset %d: class %s after %d attempts, want %s after 2", d.Offset, d.ErrorClass, d.Attempts, want)
		}
		if (d.Offset >= 3 && d.Offset <= 5) && !strings.Contains(d.ErrorMessage, "belongs to the consumer loop") {
			t.Errorf("dead letter of offset %d: %q does not say the loop owns the transaction", d.Offset, d.ErrorMessage)
		}
	}
	if want := "ok-8,savepoint-7,savepoint-7-in-savepoint"; !slices.Equal(loopEffects, kitEffects) || strings.Join(kitEffects, ",") != want {
		t.Errorf("effects differ: loop %v, kit %v; want %s", loopEffects, kitEffects, want)
	}
}

type agreeRecord struct{ value, key string }

// runLoopAndKit runs h over recs twice: through a real Consumer on the real broker (until its
// watermark passes every record), and through the kit, re-running each message the kit
// reports Retried at its next attempt, as the loop does. It returns the dead letters and the
// effects table of each.
func runLoopAndKit(t *testing.T, recs []agreeRecord, h kafkatx.Handler, cfg func() *kafkatx.Config) (loopDLs, kitDLs []dlq.DeadLetter, loopEffects, kitEffects []string) {
	t.Helper()
	brokers := testenv.Brokers(t)
	topic, group := testenv.Topic(t, brokers, 1), testenv.Group(t)

	// The loop.
	loop := setup(t, cfg())
	p, err := kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": brokers, "enable.idempotence": true, "acks": "all"})
	if err != nil {
		t.Fatal(err)
	}
	deliveries := make(chan kafka.Event, len(recs))
	for _, r := range recs {
		m := &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: 0}, Value: []byte(r.value)}
		if r.key != "" {
			m.Headers = []kafka.Header{{Key: "idempotency-key", Value: []byte(r.key)}}
		}
		if err := p.Produce(m, deliveries); err != nil {
			t.Fatal(err)
		}
	}
	for range recs {
		if m := (<-deliveries).(*kafka.Message); m.TopicPartition.Error != nil {
			t.Fatal(m.TopicPartition.Error)
		}
	}
	p.Close()
	c := cfg()
	c.Kafka = kafka.ConfigMap{"bootstrap.servers": brokers, "group.id": group, "session.timeout.ms": 6000}
	c.Topics, c.Schema = []string{topic}, loop.Schema()
	consumer, err := kafkatx.NewConsumer(loop.Pool(), h, c)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- consumer.Run(ctx) }()
	deadline := time.Now().Add(90 * time.Second)
	for {
		var next int64
		err := loop.Pool().QueryRow(context.Background(), `SELECT coalesce(max(next_offset), 0) FROM watermarks WHERE group_id = $1`, group).Scan(&next)
		if err == nil && next == int64(len(recs)) {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("the loop's watermark at %d (%v) after 90 s, want %d", next, err, len(recs))
		}
		time.Sleep(100 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	loopDLs, err = dlq.List(context.Background(), loop.Pool(), loop.Schema(), dlq.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	loopEffects = readEffects(t, loop.Pool())

	// The kit, a message retried at its next attempt until it settles.
	k := kafkatxtest.New(t, &kafkatxtest.Options{Config: cfg(), Group: group})
	if _, err := k.Pool().Exec(context.Background(), `CREATE TABLE effects (v text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	tx := k.Begin()
	var msgs []*kafkatx.Message
	for i, r := range recs {
		m := kafkatxtest.NewMessage(topic, 0, int64(i), nil, []byte(r.value))
		if r.key != "" {
			m.Headers = []kafkatx.Header{kafkatxtest.Header("idempotency-key", r.key)}
		}
		msgs = append(msgs, m)
	}
	for pending := msgs; len(pending) > 0; {
		var again []*kafkatx.Message
		for _, o := range tx.Run(h, pending...) {
			if o.Kind == kafkatxtest.Retried {
				m := *o.Message
				m.Attempt++
				again = append(again, &m)
			}
		}
		pending = again
	}
	return loopDLs, tx.DeadLetters(), loopEffects, readEffects(t, tx)
}

func describeDLs(ds []dlq.DeadLetter) []string {
	var out []string
	for _, d := range ds {
		out = append(out, fmt.Sprintf("%d %s attempts=%d %q %s", d.Offset, d.ErrorClass, d.Attempts, d.ErrorMessage, d.Value))
	}
	slices.Sort(out)
	return out
}

func readEffects(t *testing.T, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) []string {
	t.Helper()
	rows, err := q.Query(context.Background(), `SELECT v FROM effects ORDER BY v`)
	if err != nil {
		t.Fatal(err)
	}
	vs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return vs
}
