package kafkatx

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Issue 48, 4: a handler that holds its transaction idle past idle_in_transaction_session_timeout
// every time it runs was retried for ever as the database's condition — no attempt after
// 170 s, readiness 503 "no progress" two minutes later without the cause. The same offset's
// transaction ended by 25P03 engine.IdleEndsToCharge times in a row is the message's fault:
// it is dead-lettered after MaxAttempts while the other messages flow, and readiness names
// 25P03 while it happens.
func TestHandlerAlwaysPastTheIdleTimeoutIsDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	var recs []testRecord
	for p := int32(0); p < 2; p++ {
		recs = append(recs, values(10, p, func(i int) string {
			if p == 0 && i == 3 {
				return `{"pill":true}`
			}
			return fmt.Sprintf(`{"p%d":%d}`, p, i)
		})...)
	}
	produce(t, b.brokers, b.topic, recs)
	cfg := b.config(t)
	cfg.Transaction.IdleTimeout = time.Second
	cfg.Retry.MaxAttempts = 2
	r := b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if err := applyEffect(ctx, tx, b.schema, m); err != nil {
			return err
		}
		if strings.Contains(string(m.Value), "pill") {
			time.Sleep(1500 * time.Millisecond) // idle inside the transaction past its bound, every time
		}
		return nil
	}, cfg)
	named := false
	waitForThen(t, 90*time.Second, "the pill dead-lettered and the 19 others applied", func() bool {
		if !named {
			for _, why := range r.c.Readiness(context.Background()).Reasons {
				named = named || strings.Contains(why, "25P03 idle_in_transaction_session_timeout")
			}
		}
		return b.q(t, "SELECT count(*) FROM {{schema}}.dead_letters") == 1 && b.q(t, "SELECT count(*) FROM {{schema}}.effects") == 19
	}, func() string { return fmt.Sprint(r.c.Readiness(context.Background()).Reasons) })
	if !named {
		t.Errorf("readiness never named 25P03 idle_in_transaction_session_timeout while the pill's transaction was ended by it")
	}
	if n := b.q(t, `SELECT count(*) FROM {{schema}}.dead_letters WHERE partition = 0 AND "offset" = 3 AND error_message LIKE '%25P03%'`); n != 1 {
		t.Fatalf("the dead letter is not the pill's (partition 0 offset 3) naming 25P03")
	}
	waitFor(t, 30*time.Second, "ready again", func() bool { return r.c.Readiness(context.Background()).Ready })
}

// A transaction ended by 25P03 once (a pause of the process, a slow moment) spends no attempt:
// the message runs again and commits, no attempt is recorded, nothing is dead-lettered.
func TestTransactionEndedOnceByTheIdleTimeoutSpendsNoAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, values(6, 0, func(i int) string { return fmt.Sprintf(`{"i":%d}`, i) }))
	cfg := b.config(t)
	cfg.Transaction.IdleTimeout = time.Second
	cfg.Retry.MaxAttempts = 1
	var once sync.Once
	r := b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if err := applyEffect(ctx, tx, b.schema, m); err != nil {
			return err
		}
		if m.Offset == 2 {
			once.Do(func() { time.Sleep(1500 * time.Millisecond) })
		}
		return nil
	}, cfg)
	waitFor(t, 60*time.Second, "every message applied", func() bool { return b.q(t, "SELECT count(*) FROM {{schema}}.effects") == 6 })
	if dl, att := b.q(t, "SELECT count(*) FROM {{schema}}.dead_letters"), b.q(t, "SELECT count(*) FROM {{schema}}.attempts WHERE error_class <> ''"); dl != 0 || att != 0 {
		t.Fatalf("%d dead letters, %d failed attempts after one transaction ended by 25P03; want none", dl, att)
	}
	_ = r
}
