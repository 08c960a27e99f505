package dlq_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/dlq"
	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
)

// Issue "a user's first week" 3: dead letters are replayed and discarded in bulk by topic,
// error class and time range, each audited, and exactly what the dry run counted.
func TestReplayAllAndDiscardAllSelectByTopicErrorClassAndTime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	if _, err := migrations.Apply(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	tb := tables.For(schema)
	audit := pgx.Identifier{schema, "dlq_audit"}.Sanitize()
	count := func(sql string, args ...any) int64 {
		t.Helper()
		var n int64
		if err := pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	now := time.Now().UTC().Truncate(time.Second)
	old := now.Add(-48 * time.Hour)
	// 2,500 permanent failures of orders today, 300 of them a day earlier, 40 max_attempts of
	// orders, 25 permanent of payments.
	var offset int64 // unique per dead letter (a second one of an offset updates the first)
	insert := func(topic, class string, n int, at time.Time) {
		t.Helper()
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for i := range n {
				_, _, err := dlq.InsertTx(ctx, tx, schema, &dlq.DeadLetter{Group: "g", Topic: topic, Partition: int32(i % 3),
					Offset: offset, Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, "v%d", i),
					Headers:    []dlq.Header{{Key: "trace", Value: []byte{0, 1}}, {Key: outbox.HeaderOutboxID, Value: []byte("old")}},
					ErrorClass: class, ErrorMessage: "bad", Attempts: 1, FirstFailureAt: at, LastFailureAt: at})
				if err != nil {
					return err
				}
				offset++
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	insert("orders", "permanent", 2500, now)
	insert("orders", "permanent", 300, old)
	insert("orders", "max_attempts", 40, now)
	insert("payments", "permanent", 25, now)

	sel := dlq.Selection{Topic: "orders", ErrorClass: "permanent", Since: now.Add(-time.Hour)}
	sum, err := dlq.Summarize(ctx, pool, schema, sel)
	if err != nil {
		t.Fatal(err)
	}
	if len(sum) != 1 || sum[0].Count != 2500 || sum[0].Topic != "orders" || sum[0].ErrorClass != "permanent" {
		t.Fatalf("dry run %+v, want 2500 permanent dead letters of orders", sum)
	}
	sel.MaxID = dlq.MaxIDOf(sum)
	insert("orders", "permanent", 1, now.Add(time.Second)) // after the dry run: not covered

	start := time.Now()
	var n int64
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		n, err = dlq.ReplayAllTx(ctx, tx, schema, sel, dlq.Replay{ToTopic: "orders-retry", Reason: "bug 42 fixed", Actor: "ops@host"})
		return err
	})
	t.Logf("replayed %d dead letters in %v", n, time.Since(start))
	if err != nil || n != 2500 {
		t.Fatalf("replay all: %d, %v; want 2500", n, err)
	}
	if got := count(`SELECT count(*) FROM ` + tb.DeadLetters + ` WHERE status = 'replayed'`); got != 2500 {
		t.Fatalf("%d replayed, want 2500", got)
	}
	// One outbox row per dead letter, with its bytes, the trace header and no old outbox id,
	// named by its audit row.
	if got := count(`SELECT count(*) FROM ` + tb.DeadLetters + ` d JOIN ` + audit + ` a ON a.dead_letter_id = d.id AND a.action = 'replay'
		JOIN ` + tb.Outbox + ` o ON o.id = a.outbox_row WHERE o.topic = 'orders-retry' AND a.to_topic = 'orders-retry'
		AND o.key = d.key AND o.value = d.value AND o.header_keys = ARRAY['trace'::bytea] AND a.reason = 'bug 42 fixed' AND a.actor = 'ops@host'`); got != 2500 {
		t.Fatalf("%d replays with their outbox row and audit row, want 2500", got)
	}
	if got := count(`SELECT count(*) FROM ` + tb.Outbox); got != 2500 {
		t.Fatalf("%d outbox rows, want 2500", got)
	}

	// Replaying the same selection again finds nothing without Again, everything with it.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if n, err = dlq.ReplayAllTx(ctx, tx, schema, sel, dlq.Replay{Reason: "again"}); err != nil || n != 0 {
			return fmt.Errorf("replay of replayed ones without Again: %d, %w", n, err)
		}
		n, err = dlq.ReplayAllTx(ctx, tx, schema, sel, dlq.Replay{Reason: "again", Again: true})
		return err
	})
	if err != nil || n != 2500 {
		t.Fatalf("replay again: %d, %v", n, err)
	}

	// Discard what failed before yesterday, of any topic and class.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		n, err = dlq.DiscardAllTx(ctx, tx, schema, dlq.Selection{Until: now.Add(-24 * time.Hour)}, dlq.Action{Reason: "too old", Actor: "ops"})
		return err
	})
	if err != nil || n != 300 {
		t.Fatalf("discard all older than a day: %d, %v; want 300", n, err)
	}
	if got := count(`SELECT count(*) FROM `+tb.DeadLetters+` d JOIN `+audit+` a ON a.dead_letter_id = d.id
		WHERE d.status = 'discarded' AND a.action = 'discard' AND a.reason = 'too old' AND d.last_failure_at < $1`, now.Add(-24*time.Hour)); got != 300 {
		t.Fatalf("%d audited discards, want 300", got)
	}
	if got := count(`SELECT count(*) FROM ` + tb.DeadLetters + ` WHERE status = 'new'`); got != 40+25+1 {
		t.Fatalf("%d new dead letters left, want 66 (the other class, topic, and the one after the dry run)", got)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := dlq.DiscardAllTx(ctx, tx, schema, dlq.Selection{}, dlq.Action{})
		return err
	})
	if !errors.Is(err, dlq.ErrNoReason) {
		t.Fatalf("discard without a reason: %v", err)
	}
}
