package kafkatx

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// Issue "outages a service must ride out", a frozen broker: the broker's JVM SIGSTOPped for
// 30 s mid-drain and SIGCONTed. With a static member the consumer never joined the group again
// (its synchronous offset commit waited forever and its client stayed without a coordinator,
// "Kafka unreachable" while the broker answered), SIGTERM then hung past CloseTimeout in the
// close of that client, and once the process aborted in librdkafka
// (rd_kafka_admin_response_parse: Assertion `rko_result' failed) on the answer to the log
// identity check's DescribeCluster. Now: several freezes in a row, each longer than the
// session timeout; after every one the drain goes on, every message is applied exactly once,
// and a stop during a freeze and after the last one ends Run within CloseTimeout and a bound.
func TestStaticMemberRidesOutAFrozenBroker(t *testing.T) { frozenBroker(t, true) }

// The same freezes without group.instance.id (a dynamic member): exact, and stops bounded.
func TestDynamicMemberRidesOutAFrozenBroker(t *testing.T) { frozenBroker(t, false) }

// stopBound is what a stop may take past Config.CloseTimeout: the workers' shutdown
// (ShutdownTimeout, 5 s in these tests' configs at most) and the loop's own steps.
const stopBound = 15 * time.Second

func frozenBroker(t *testing.T, static bool) {
	testenv.NeedBrokerKills(t)
	b := setup(t, 3)
	const perRound = 1500
	const rounds = 4
	const freeze = 16 * time.Second // session.timeout.ms is 6 s
	cfg := b.config(t)
	if static {
		cfg.Kafka["group.instance.id"] = "frozen-" + b.topic
	}
	cfg.Kafka["session.timeout.ms"] = 6000
	cfg.CloseTimeout = 5 * time.Second
	cfg.Logger = zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		time.Sleep(2 * time.Millisecond) // a drain that lasts across the freeze
		return applyEffect(ctx, tx, b.schema, m)
	}
	applied := func() int64 { return b.q(t, `SELECT count(*) FROM {{schema}}.effects`) }
	// Every progress target is counted from before the produce that makes it reachable: one
	// counted after it could pass the end of the topic when the drain outran the test (a
	// loaded CI machine once left a round waiting for 200 more messages than there were).
	var total int64
	r := b.start(t, h, cfg)
	for round := 1; round <= rounds; round++ {
		base := applied()
		produce(t, b.brokers, b.topic, values(perRound, -1, func(i int) string { return fmt.Sprintf("pre%d-%d", round, i) }))
		total += perRound
		waitFor(t, 90*time.Second, fmt.Sprintf("round %d: progress before the freeze", round), func() bool { return applied() >= base+200 })
		testenv.FreezeBroker(t, b.brokers, freeze)
		base = applied()
		produce(t, b.brokers, b.topic, values(perRound, -1, func(i int) string { return fmt.Sprintf("r%d-%d", round, i) }))
		total += perRound
		// The readiness at the deadline, not at the call: a failure here once printed the
		// "brokers are down" of the first instant after the resume, which said nothing.
		waitForThen(t, 90*time.Second, fmt.Sprintf("round %d: the drain goes on after the broker resumed", round),
			func() bool { return applied() >= base+300 },
			func() string { return fmt.Sprintf("readiness now %v", r.c.Readiness(context.Background()).Reasons) })
		select {
		case err := <-r.done:
			t.Fatalf("round %d: Run returned after the freeze: %v", round, err)
		default:
		}
		t.Logf("round %d: %d applied", round, applied())
	}
	waitFor(t, 120*time.Second, "every message applied", func() bool { return applied() >= total })
	waitFor(t, 60*time.Second, "ready with the broker answering", func() bool { return r.c.Ready(context.Background()) == nil })

	// A stop (SIGTERM) while the broker is frozen ends Run within CloseTimeout and a bound.
	base := applied()
	produce(t, b.brokers, b.topic, values(perRound, -1, func(i int) string { return fmt.Sprintf("last-%d", i) }))
	total += perRound
	waitFor(t, 60*time.Second, "progress before the last freeze", func() bool { return applied() >= base+100 })
	resume := testenv.StopBroker(t, b.brokers)
	time.Sleep(8 * time.Second) // past the session timeout
	stopWithin(t, r, cfg.CloseTimeout+stopBound, "with the broker frozen")
	time.Sleep(4 * time.Second)
	resume()

	// A new consumer drains the rest exactly once and stops within the bound.
	produce(t, b.brokers, b.topic, values(perRound, -1, func(i int) string { return fmt.Sprintf("after-%d", i) }))
	total += perRound
	r2 := b.start(t, h, cfg)
	waitFor(t, 120*time.Second, "every message applied by the next consumer", func() bool { return applied() >= total })
	if n, dup := applied(), b.q(t, `SELECT count(*) FROM {{schema}}.effects WHERE applied <> 1`); n != total || dup != 0 {
		t.Fatalf("%d messages applied, %d more than once; want %d, 0", n, dup, total)
	}
	stopWithin(t, r2, cfg.CloseTimeout+stopBound, "after the freezes")
}

// stopWithin cancels r's Run and fails unless it returns nil within bound.
func stopWithin(t *testing.T, r *running, bound time.Duration, when string) {
	t.Helper()
	t0 := time.Now()
	r.cancel()
	select {
	case err := <-r.done:
		close(r.done) // the cleanup's stop sees it stopped
		if err != nil {
			t.Fatalf("Run returned %v after a stop %s", err, when)
		}
		t.Logf("stopped %s after the cancel, %s", time.Since(t0).Round(time.Millisecond), when)
	case <-time.After(bound):
		t.Fatalf("Run did not return within %s of a stop %s", bound, when)
	}
}
