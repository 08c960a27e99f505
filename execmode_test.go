package kafkatx

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/dlq"
	"github.com/kafkatx/kafkatx/idempotency"
	"github.com/kafkatx/kafkatx/internal/offsets"
	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
	"github.com/kafkatx/kafkatx/outbox/relay"
	"github.com/kafkatx/kafkatx/retention"
)

// Every statement kafkatx sends must work in each query exec mode pgx v5 offers (issue 48):
// exec and simple_protocol send arguments as untyped text — a []byte argument where the SQL
// wants json became bytea's hex text there. One schema and one topic serve every mode; each
// mode runs the same scenario with its own consumer group on a pool in that mode:
//
//   - the loop, batched, in two lanes (Config.Concurrency): business idempotency keys claimed (one duplicate skipped), a
//     FailMessage dead letter published through the outbox, outbox records written by the
//     handler, watermark advances, Kafka offset commits and their marks, log identity;
//   - readiness (the consumer's checks of its database);
//   - the table relay: reads the outbox, publishes, marks rows published; Backlog, Pending, Clean;
//   - dlq: List, Get, Search, Summarize, Audit, ReplayTx, ReplayAllTx, DiscardAllTx;
//   - outbox: Parked, ParkedSummary, ReleaseAllTx, DiscardAllTx, WaitBelow (backpressure);
//   - idempotency: Store.ClaimTx, ClaimManyTx, Done, Forget; Janitor.Sweep;
//   - retention.Cleaner.Clean (every table it sweeps);
//   - offsets (the `kafkatx offsets` commands): Status, Account, Events, PlanReset and
//     ExecuteReset (a skip).
//
// The HTTP middleware, the console and kafkatxtest have their own test per mode
// (TestStoreAndReplayInEveryQueryExecMode, TestConsoleInEveryQueryExecMode,
// TestKitInEveryQueryExecMode).
func TestLibrarySQLInEveryQueryExecMode(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	out := testenv.Topic(t, b.brokers, 1)
	// Offsets 0-5: a key claimed, the same key again (a duplicate), a poison message, two
	// more keys, a message without a key.
	var recs []testRecord
	for i, v := range []string{"a", "a", "poison", "b", "c", ""} {
		r := testRecord{value: []byte(fmt.Sprintf("v%d", i)), partition: 0}
		if v == "poison" {
			r.value = []byte("poison")
		} else if v != "" {
			r.headers = []kafka.Header{{Key: "biz", Value: []byte(v)}}
		}
		recs = append(recs, r)
	}
	produce(t, b.brokers, b.topic, recs)
	for _, mode := range testenv.QueryExecModeNames {
		t.Run(mode, func(t *testing.T) { execModeScenario(t, b, out, mode) })
	}
}

func execModeScenario(t *testing.T, b *testBundle, out, mode string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pool := testenv.PostgresInMode(t, mode)
	group := b.group + "-" + mode
	w := outbox.Writer{Schema: b.schema}

	// The loop.
	cfg := b.config(t)
	cfg.Kafka["group.id"] = group
	cfg.Batch.Size = 10
	cfg.Concurrency = 2 // lanes: done_offsets marks and their watermark folding
	cfg.Idempotency.Key = idempotency.FromHeader("biz")
	cfg.DeadLetter.Topic = func(string) string { return out }
	c, err := NewBatchConsumer(pool, func(ctx context.Context, tx pgx.Tx, msgs []*Message) error {
		for _, m := range msgs {
			if string(m.Value) == "poison" {
				return FailMessage(m, Permanent(errors.New("poison pill")))
			}
			if _, err := w.WriteTx(ctx, tx, outbox.Record{Topic: out, Key: m.Value, Value: m.Value,
				Headers: []outbox.Header{{Key: "mode", Value: []byte(mode)}}}); err != nil {
				return err
			}
		}
		return nil
	}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := run(t, c)
	waitFor(t, 60*time.Second, "the loop past offset 5", func() bool {
		return b.q(t, "SELECT coalesce(max(next_offset), 0) FROM {{schema}}.watermarks WHERE group_id = $1", group) == 6
	})
	waitFor(t, 30*time.Second, "the consumer ready", func() bool { return c.Readiness(ctx).Ready })
	st := c.Stats()
	if err := r.stop(t); err != nil {
		t.Fatalf("the loop stopped with %v", err)
	}
	if st.Duplicates != 1 || st.DeadLettered != 1 {
		t.Fatalf("duplicates %d, dead lettered %d; want 1 and 1", st.Duplicates, st.DeadLettered)
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.idempotency_keys WHERE scope LIKE $1 || '/%'", group); n != 3 {
		t.Fatalf("%d idempotency keys claimed, want 3", n)
	}

	// The relay publishes the handler's 4 records and the dead letter's, and marks them.
	pending := func() int64 {
		return b.q(t, "SELECT count(*) FROM {{schema}}.outbox WHERE topic = $1 AND state = 'pending'", out)
	}
	if pending() < 5 {
		t.Fatalf("%d outbox rows pending, want at least 5", pending())
	}
	rl, err := relay.New(pool, &relay.Config{Kafka: kafka.ConfigMap{"bootstrap.servers": b.brokers}, Schema: b.schema,
		Logger: zap.NewNop(), PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(ctx)
	rdone := make(chan error, 1)
	go func() { rdone <- rl.Run(rctx) }()
	waitFor(t, 60*time.Second, "the relay marking every outbox row", func() bool { return pending() == 0 })
	if _, _, err := rl.Backlog(ctx); err != nil {
		t.Fatalf("relay backlog: %v", err)
	}
	if _, err := rl.Pending(ctx); err != nil {
		t.Fatalf("relay pending: %v", err)
	}
	if err := rl.Clean(ctx); err != nil {
		t.Fatalf("relay clean: %v", err)
	}
	rcancel()
	if err := <-rdone; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("relay: %v", err)
	}

	// Dead letters.
	dls, err := dlq.List(ctx, pool, b.schema, dlq.Filter{Group: group})
	if err != nil || len(dls) != 1 {
		t.Fatalf("dlq.List: %d dead letters, %v; want 1", len(dls), err)
	}
	id := dls[0].ID
	if _, err := dlq.Get(ctx, pool, b.schema, id); err != nil {
		t.Fatalf("dlq.Get: %v", err)
	}
	if found, err := dlq.Search(ctx, pool, b.schema, dlq.Query{Filter: dlq.Filter{Group: group}, Text: "poison", Prefix: 16}); err != nil || len(found) != 1 {
		t.Fatalf("dlq.Search: %d found, %v; want 1", len(found), err)
	}
	sel := dlq.Selection{Group: group, Since: time.Now().Add(-time.Hour), MaxID: 1 << 40} // ids are bigint
	if sums, err := dlq.Summarize(ctx, pool, b.schema, sel); err != nil || len(sums) != 1 {
		t.Fatalf("dlq.Summarize: %v, %v", sums, err)
	}
	inTx(t, ctx, pool, func(tx pgx.Tx) error {
		_, _, err := dlq.ReplayTx(ctx, tx, b.schema, id, dlq.Replay{ToTopic: out, Reason: "exec mode " + mode, Actor: "test"})
		return err
	})
	inTx(t, ctx, pool, func(tx pgx.Tx) error {
		n, err := dlq.DiscardAllTx(ctx, tx, b.schema, dlq.Selection{Group: group, MaxID: id}, dlq.Action{Reason: "none left", Actor: "test"})
		if err == nil && n != 0 {
			err = fmt.Errorf("discarded %d, want 0 (the one dead letter was replayed)", n)
		}
		return err
	})
	if a, err := dlq.Audit(ctx, pool, b.schema, id); err != nil || len(a) != 1 {
		t.Fatalf("dlq.Audit: %v, %v; want the replay", a, err)
	}
	inTx(t, ctx, pool, func(tx pgx.Tx) error {
		n, err := dlq.ReplayAllTx(ctx, tx, b.schema, dlq.Selection{Group: group, Again: true, MaxID: id}, dlq.Replay{ToTopic: out, Reason: "again", Actor: "test", Again: true})
		if err == nil && n != 1 {
			err = fmt.Errorf("replayed %d again, want 1", n)
		}
		return err
	})

	// Outbox and idempotency keys.
	if _, err := w.Parked(ctx, pool, 10); err != nil {
		t.Fatalf("outbox parked: %v", err)
	}
	if _, err := w.ParkedSummary(ctx, pool, outbox.ParkedSelection{Topic: out}); err != nil {
		t.Fatalf("outbox parked summary: %v", err)
	}
	inTx(t, ctx, pool, func(tx pgx.Tx) error {
		if _, err := w.ReleaseAllTx(ctx, tx, outbox.ParkedSelection{Topic: out, MaxID: 1 << 40}, "exec mode", "test"); err != nil {
			return err
		}
		_, err := w.DiscardAllTx(ctx, tx, outbox.ParkedSelection{Topic: out}, "exec mode", "test")
		return err
	})
	if err := w.WaitBelow(pool, 1<<40)(ctx); err != nil {
		t.Fatalf("outbox backpressure: %v", err)
	}
	s := idempotency.Store{Schema: b.schema, Retention: time.Hour}
	scope := "exec-mode/" + mode
	inTx(t, ctx, pool, func(tx pgx.Tx) error {
		if first, err := s.ClaimTx(ctx, tx, scope, `back\slash`); err != nil || !first {
			return fmt.Errorf("claim: %v %v", first, err)
		}
		firsts, err := s.ClaimManyTx(ctx, tx, scope, []string{`back\slash`, "x"})
		if err == nil && (firsts[0] || !firsts[1]) {
			err = fmt.Errorf("claim many: %v, want [false true]", firsts)
		}
		return err
	})
	if done, err := s.Done(ctx, pool, scope, `back\slash`); err != nil || !done {
		t.Fatalf("idempotency Done: %v %v", done, err)
	}
	if forgot, err := s.Forget(ctx, pool, scope, `back\slash`); err != nil || !forgot {
		t.Fatalf("idempotency Forget: %v %v", forgot, err)
	}

	if _, err := idempotency.NewJanitor(pool, &idempotency.JanitorConfig{Schema: b.schema}).Sweep(ctx); err != nil {
		t.Fatalf("idempotency janitor: %v", err)
	}

	// Retention.
	if _, err := retention.New(pool, b.schema, retention.Config{}, zap.NewNop(), retention.WithOutbox(time.Nanosecond)).Clean(ctx); err != nil {
		t.Fatalf("retention: %v", err)
	}

	// The offsets commands.
	k, err := offsets.NewKafka(kafka.ConfigMap{"bootstrap.servers": b.brokers}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	op := offsets.NewOperator(pool, k, b.schema)
	if sts, err := op.Status(ctx, group, b.topic); err != nil || len(sts) != 1 {
		t.Fatalf("offsets status: %v, %v", sts, err)
	}
	if _, err := op.Account(ctx, group, b.topic, 0); err != nil {
		t.Fatalf("offsets account: %v", err)
	}
	if _, err := op.Group(ctx, group); err != nil {
		t.Fatalf("offsets group: %v", err)
	}
	plan, err := op.PlanReset(ctx, offsets.ResetRequest{Group: group, Topic: b.topic, Partition: 0,
		Target: offsets.Target{Kind: offsets.TargetOffset, Offset: 6}, Mode: offsets.ModeSkip, Reason: "exec mode " + mode, Actor: "test"})
	if err != nil {
		t.Fatalf("offsets reset plan: %v", err)
	}
	if err := op.ExecuteReset(ctx, plan); err != nil {
		t.Fatalf("offsets reset: %v", err)
	}
	if ev, err := op.Events(ctx, group, b.topic); err != nil {
		t.Fatalf("offsets audit: %v, %v", ev, err)
	}
}

func inTx(t *testing.T, ctx context.Context, pool interface {
	Begin(context.Context) (pgx.Tx, error)
}, f func(pgx.Tx) error) {
	t.Helper()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := f(tx); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}
