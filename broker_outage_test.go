package kafkatx

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// Issue "outages a service must ride out" 1: a broker outage longer than the session timeout
// made the broker forget the only static member; its commit was refused (Unknown member), then
// librdkafka fenced it ("Static consumer fenced by other consumer with same
// group.instance.id", fatal) and Run ended. Now Run builds a new Kafka client and rejoins with
// the same id: testenv.KillRounds SIGKILLs of the broker, each down longer than the session
// timeout, and the consumer never stops; every message is applied exactly once.
func TestStaticMemberRidesOutBrokerRestarts(t *testing.T) {
	testenv.NeedBrokerKills(t)
	b := setup(t, 3)
	const perRound = 1500
	rounds := testenv.KillRounds
	cfg := b.config(t)
	cfg.Kafka["group.instance.id"] = "outage-" + b.topic
	cfg.Kafka["session.timeout.ms"] = 6000
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		time.Sleep(2 * time.Millisecond) // a drain that lasts across the outage
		return applyEffect(ctx, tx, b.schema, m)
	}
	r := b.start(t, h, cfg)
	applied := func() int64 { return b.q(t, `SELECT count(*) FROM {{schema}}.effects`) }
	// The progress target is counted from before the produce that makes it reachable (see
	// frozenBroker): counted after it, a drain that outran the test could leave it past the end.
	var total int64
	for round := 1; round <= rounds; round++ {
		base := applied()
		produce(t, b.brokers, b.topic, values(perRound, -1, func(i int) string { return fmt.Sprintf("pre%d-%d", round, i) }))
		total += perRound
		waitFor(t, 120*time.Second, fmt.Sprintf("round %d: progress before the outage", round), func() bool { return applied() >= base+200 })
		testenv.KillBroker(t, b.brokers, 8*time.Second) // session.timeout.ms is 6 s
		select {
		case err := <-r.done:
			t.Fatalf("round %d: Run returned after the broker restart: %v", round, err)
		default:
		}
		produce(t, b.brokers, b.topic, values(perRound, -1, func(i int) string { return fmt.Sprintf("r%d-%d", round, i) }))
		total += perRound
		t.Logf("round %d: %d applied, readiness %+v", round, applied(), r.c.Readiness(context.Background()).Reasons)
	}
	waitFor(t, 300*time.Second, "every message applied", func() bool { return applied() >= total })
	select {
	case err := <-r.done:
		t.Fatalf("Run returned: %v", err)
	default:
	}
	if n, dup := applied(), b.q(t, `SELECT count(*) FROM {{schema}}.effects WHERE applied <> 1`); n != total || dup != 0 {
		t.Fatalf("%d messages applied, %d more than once; want %d, 0", n, dup, total)
	}
	waitFor(t, 60*time.Second, "ready after the last restart", func() bool { return r.c.Ready(context.Background()) == nil })
	t.Logf("rejoins with a new Kafka client: %d", r.c.Readiness(context.Background()).Rejoins)
}

// Issue "outages a service must ride out" 2: the broker killed while Config.Backpressure held
// every partition (their fetch paused, their buffers full) left a consumer alive and silent
// after the partitions came back: nothing applied, no log line, ready. testenv.KillRounds
// times: hold every partition, kill the broker for longer than the session timeout, let go;
// every message of the round is applied within a bound, exactly once, and the watchdog reports
// nothing stalled at the end.
func TestBrokerKilledDuringABackpressureHoldLeavesNoPartitionBehind(t *testing.T) {
	testenv.NeedBrokerKills(t)
	b := setup(t, 3)
	cfg := b.config(t)
	cfg.Kafka["group.instance.id"] = "hold-" + b.topic
	cfg.Batch.Size = 50                 // a worker queues 100 messages: the rest wait in the poll loop
	cfg.MaxBufferedBytes = 3 * 16 << 10 // a share of 16 KiB: a held partition stops fetching
	cfg.StallAfter = 20 * time.Second
	var hold atomic.Bool
	cfg.Backpressure = func(ctx context.Context) error {
		for hold.Load() {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
		return nil
	}
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error { return applyEffect(ctx, tx, b.schema, m) }
	r := b.start(t, h, cfg)
	applied := func() int64 { return b.q(t, `SELECT count(*) FROM {{schema}}.effects`) }
	const perRound = 900
	const rounds = testenv.KillRounds
	for round := 1; round <= rounds; round++ {
		hold.Store(true)
		produce(t, b.brokers, b.topic, values(perRound, -1, func(i int) string { return fmt.Sprintf("r%d-%d", round, i) }))
		waitFor(t, 120*time.Second, fmt.Sprintf("round %d: every partition held back", round), func() bool { return r.c.Stats().HeldBack == 3 })
		time.Sleep(time.Second) // the fetch fills the buffers and pauses
		testenv.KillBroker(t, b.brokers, 8*time.Second)
		hold.Store(false)
		want := int64(perRound * round)
		waitFor(t, 120*time.Second, fmt.Sprintf("round %d: all %d messages applied after the outage", round, want), func() bool { return applied() >= want })
		select {
		case err := <-r.done:
			t.Fatalf("round %d: Run returned: %v", round, err)
		default:
		}
		t.Logf("round %d: %d applied, %d pauses, readiness %v", round, applied(), r.c.Stats().Pauses, r.c.Readiness(context.Background()).Reasons)
	}
	if p := r.c.Stats().Pauses; p < rounds {
		t.Fatalf("%d pauses in %d rounds: the holds did not fill the partitions' buffers", p, rounds)
	}
	if n, dup := applied(), b.q(t, `SELECT count(*) FROM {{schema}}.effects WHERE applied <> 1`); n != perRound*rounds || dup != 0 {
		t.Fatalf("%d applied, %d more than once; want %d, 0", n, dup, perRound*rounds)
	}
	if st := r.c.Readiness(context.Background()).Stalled; len(st) != 0 {
		t.Fatalf("stalled partitions after the last round: %+v", st)
	}
}
