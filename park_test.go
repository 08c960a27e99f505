package kafkatx

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// keyed returns n records on partition 0 with keys k0..k(keys-1) in turn: record i has key
// k(i mod keys).
func keyedRecords(n, keys int) []testRecord {
	out := make([]testRecord, n)
	for i := range out {
		out[i] = testRecord{key: []byte(fmt.Sprintf("k%d", i%keys)), value: []byte(fmt.Sprintf(`{"i":%d}`, i)), partition: 0}
	}
	return out
}

// keyOrder fails t unless key's effects were applied once each, in offset order.
func (b *testBundle) keyOrder(t *testing.T, key string, want int) {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), fmt.Sprintf(`SELECT "offset", applied FROM %s ORDER BY seq`,
		pgx.Identifier{b.schema, "effects"}.Sanitize()))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var offs []int64
	for rows.Next() {
		var off int64
		var applied int
		if err := rows.Scan(&off, &applied); err != nil {
			t.Fatal(err)
		}
		if applied != 1 {
			t.Fatalf("offset %d applied %d times", off, applied)
		}
		offs = append(offs, off)
	}
	var mine []int64
	for _, o := range offs {
		if fmt.Sprintf("k%d", o%10) == key { // the tests' records: key k(offset mod keys), keys = 10
			mine = append(mine, o)
		}
	}
	if len(mine) != want {
		t.Fatalf("key %s: %d messages applied, want %d", key, len(mine), want)
	}
	for i := 1; i < len(mine); i++ {
		if mine[i] < mine[i-1] {
			t.Fatalf("key %s applied out of offset order: %v", key, mine)
		}
	}
}

// One key failing parks, with Concurrency 1 and 4: the partition's other keys are all applied
// while it still fails, the key's messages wait in key_parking (none applied, none run before
// the ones parked before them), and once it recovers they are applied once each, in offset
// order; the consumer is not idle while the key is parked.
func TestParkedKeyLetsOtherKeysFlow(t *testing.T) {
	for _, n := range []int{1, 4} {
		t.Run(fmt.Sprintf("concurrency-%d", n), func(t *testing.T) {
			t.Parallel()
			b := setup(t, 1)
			produce(t, b.brokers, b.topic, keyedRecords(200, 10))
			var down atomic.Bool
			down.Store(true)
			var tries atomic.Int64
			cfg := b.config(t)
			cfg.Concurrency = n
			cfg.Park.Enabled = true
			cfg.Retry.MaxAttempts = 1000
			r := b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error {
				if string(m.Key) == "k7" && down.Load() {
					tries.Add(1)
					return errors.New("tenant 7's service answered 503")
				}
				return applyEffect(ctx, tx, b.schema, m)
			}, cfg)
			r.waitFor(t, 90*time.Second, "the 180 messages of the other keys applied while k7 fails", func() bool {
				return b.q(t, "SELECT count(*) FROM {{schema}}.effects") == 180
			})
			if got := b.q(t, "SELECT count(*) FROM {{schema}}.key_parking"); got != 20 {
				t.Fatalf("%d parked messages while k7 fails, want its 20", got)
			}
			r.waitFor(t, 30*time.Second, "the head of k7 tried again by the retrier", func() bool { return tries.Load() >= 3 })
			if s := r.c.Stats(); s.InFlight < 20 {
				t.Fatalf("Stats.InFlight %d while k7's 20 messages are parked: the consumer would look idle", s.InFlight)
			}
			if got := b.q(t, "SELECT count(*) FROM {{schema}}.effects WHERE \"offset\" % 10 = 7"); got != 0 {
				t.Fatalf("%d messages of k7 applied while it fails", got)
			}
			// With lanes the coordinator moves the watermark after the units commit: wait for it,
			// while k7 still fails (its messages are parked, not applied).
			r.waitFor(t, 30*time.Second, "the watermark past k7's parked offsets (200)", func() bool {
				return b.q(t, "SELECT next_offset FROM {{schema}}.watermarks") == 200
			})
			if got := b.q(t, "SELECT count(*) FROM {{schema}}.effects WHERE \"offset\" % 10 = 7"); got != 0 {
				t.Fatalf("%d messages of k7 applied while it fails", got)
			}
			down.Store(false)
			r.waitFor(t, 60*time.Second, "k7's messages applied after it recovers", func() bool {
				return b.q(t, "SELECT count(*) FROM {{schema}}.effects") == 200 && b.q(t, "SELECT count(*) FROM {{schema}}.key_parking") == 0
			})
			b.keyOrder(t, "k7", 20)
			if got := b.q(t, "SELECT count(*) FROM {{schema}}.dead_letters"); got != 0 {
				t.Fatalf("%d dead letters", got)
			}
		})
	}
}

// A key whose dependency answers Unavailable parks spending no attempt, while the others go
// on; it is applied once the dependency answers again.
func TestParkedKeyUnavailableSpendsNoAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, keyedRecords(100, 10))
	var down atomic.Bool
	down.Store(true)
	var tries atomic.Int64
	cfg := b.config(t)
	cfg.Park.Enabled = true
	cfg.Retry.MaxAttempts = 2
	r := b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if string(m.Key) == "k3" && down.Load() {
			tries.Add(1)
			return Unavailable(errors.New("503 for tenant 3"))
		}
		return applyEffect(ctx, tx, b.schema, m)
	}, cfg)
	r.waitFor(t, 90*time.Second, "the others applied and k3's head tried 5 times", func() bool {
		return b.q(t, "SELECT count(*) FROM {{schema}}.effects") == 90 && tries.Load() >= 5
	})
	if got := b.q(t, "SELECT coalesce(max(attempts), 0) FROM {{schema}}.key_parking"); got != 0 {
		t.Fatalf("a parked Unavailable head counts %d attempts, want 0", got)
	}
	if got := b.q(t, "SELECT count(*) FROM {{schema}}.dead_letters"); got != 0 {
		t.Fatalf("%d dead letters after Unavailable answers with MaxAttempts 2", got)
	}
	down.Store(false)
	r.waitFor(t, 60*time.Second, "k3 applied", func() bool { return b.q(t, "SELECT count(*) FROM {{schema}}.effects") == 100 })
	b.keyOrder(t, "k3", 10)
}

// A parked key's head that exhausts its attempts is dead-lettered, and the key's next
// message runs next, in order.
func TestParkedHeadExhaustedDeadLettersThenNextRuns(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, keyedRecords(50, 10))
	cfg := b.config(t)
	cfg.Park.Enabled = true
	cfg.Retry.MaxAttempts = 3
	r := b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if m.Offset == 5 { // k5's first message: a poison pill
			return errors.New("bad record")
		}
		return applyEffect(ctx, tx, b.schema, m)
	}, cfg)
	r.waitFor(t, 90*time.Second, "49 applied and offset 5 dead-lettered", func() bool {
		return b.q(t, "SELECT count(*) FROM {{schema}}.effects") == 49 && b.q(t, "SELECT count(*) FROM {{schema}}.key_parking") == 0
	})
	if got := b.q(t, `SELECT count(*) FROM {{schema}}.dead_letters WHERE "offset" = 5 AND attempts = 3`); got != 1 {
		t.Fatalf("%d dead letters of offset 5 after 3 attempts, want 1", got)
	}
	b.keyOrder(t, "k5", 4)
}

// A failure every key meets is shared, not a key's: the breaker opens after a few keys
// parked (threshold 3: at most 2), the partition is held as without parking — nothing
// dead-lettered, not every key parked — and once it recovers everything is applied once, each
// key in order.
func TestSharedFailureDoesNotParkEveryKey(t *testing.T) {
	for _, unavailable := range []bool{false, true} {
		t.Run(fmt.Sprintf("unavailable-%v", unavailable), func(t *testing.T) { sharedFailure(t, unavailable) })
	}
}

// sharedFailure: every key fails alike — an error, or an Unavailable answer worded its own
// way for each message (a run id in its text, as an orchestrator's refusal names its run).
func sharedFailure(t *testing.T, unavailable bool) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, keyedRecords(100, 10))
	var down atomic.Bool
	down.Store(true)
	var tries atomic.Int64
	cfg := b.config(t)
	cfg.Park.Enabled = true
	cfg.Breaker.Probe = 100 * time.Millisecond
	// Attempts enough that the parked heads' retries (20 ms backoff) do not exhaust before the
	// third key opens the breaker on a slow machine: dead letters by exhaustion are not what
	// this test is about (without parking the first messages would be dead-lettered as well).
	cfg.Retry.MaxAttempts = 1000
	r := b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if down.Load() {
			tries.Add(1)
			if unavailable {
				return Unavailable(fmt.Errorf("trigger run kafkatx__%c%c: the orchestrator answered 503", rune('a'+m.Offset%26), rune('a'+m.Offset/26%26)))
			}
			return errors.New("the orchestrator answered 503 to everyone")
		}
		return applyEffect(ctx, tx, b.schema, m)
	}, cfg)
	r.waitFor(t, 60*time.Second, "the breaker open", func() bool { return r.c.Readiness(context.Background()).Breaker != nil && tries.Load() > 10 })
	time.Sleep(time.Second)
	// A dependency's Unavailable answers hold as a breaker of their own kind, and the consumer
	// stays ready (a partition waiting on a dependency does); a handler's failures make it unready.
	if rd := r.c.Readiness(context.Background()); rd.Breaker == nil || rd.Breaker.Dependency != unavailable || rd.Ready != unavailable {
		t.Fatalf("readiness during a shared failure (unavailable %v): ready %v, breaker %+v; want ready and Dependency only for Unavailable answers", unavailable, rd.Ready, rd.Breaker)
	}
	if got := b.q(t, "SELECT count(DISTINCT key_hash) FROM {{schema}}.key_parking"); got > 2 {
		t.Fatalf("%d keys parked by a failure every key meets, want at most 2 (the breaker's threshold less one)", got)
	}
	if got := b.q(t, "SELECT count(*) FROM {{schema}}.dead_letters"); got != 0 {
		t.Fatalf("%d dead letters during a shared failure", got)
	}
	down.Store(false)
	r.waitFor(t, 60*time.Second, "everything applied", func() bool {
		return b.q(t, "SELECT count(*) FROM {{schema}}.effects") == 100 && b.q(t, "SELECT count(*) FROM {{schema}}.key_parking") == 0
	})
	for k := 0; k < 10; k++ {
		b.keyOrder(t, fmt.Sprintf("k%d", k), 10)
	}
}

// A consumer restarted (a rebalance to another member) with a key parked loads the parked
// keys at assignment: the key's later messages park behind it, never run before it.
func TestParkedKeySurvivesRestart(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, keyedRecords(50, 10))
	var down atomic.Bool
	down.Store(true)
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if string(m.Key) == "k2" && down.Load() {
			return errors.New("503")
		}
		return applyEffect(ctx, tx, b.schema, m)
	}
	cfg := b.config(t)
	cfg.Park.Enabled = true
	cfg.Retry.MaxAttempts = 1000
	r := b.start(t, h, cfg)
	r.waitFor(t, 60*time.Second, "45 applied, k2 parked", func() bool {
		return b.q(t, "SELECT count(*) FROM {{schema}}.effects") == 45 && b.q(t, "SELECT count(*) FROM {{schema}}.key_parking") == 5
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	produce(t, b.brokers, b.topic, keyedRecords(50, 10)[:30]) // offsets 50..79: k2 at 52, 62, 72
	r = b.start(t, h, b.config(t).withPark())
	r.waitFor(t, 60*time.Second, "the new messages of the other keys applied, k2's parked behind", func() bool {
		return b.q(t, "SELECT count(*) FROM {{schema}}.effects") == 72 && b.q(t, "SELECT count(*) FROM {{schema}}.key_parking") == 8
	})
	down.Store(false)
	r.waitFor(t, 60*time.Second, "k2 applied", func() bool { return b.q(t, "SELECT count(*) FROM {{schema}}.effects") == 80 })
	b.keyOrder(t, "k2", 8)
}

func (c *Config) withPark() *Config {
	c.Park.Enabled = true
	c.Retry.MaxAttempts = 1000
	return c
}

// SIGKILL at each step of parking — a key's first failing message parked, a later one parked
// behind it, the retrier's try of the head before and after its commit, the next parked
// message's run, a head's dead letter — then a restart: every message applied once or
// dead-lettered once, each key's in offset order, nothing left parked.
func TestParkedKeysSIGKILLAtEachStep(t *testing.T) {
	t.Parallel()
	requireServices(t)
	for _, c := range []struct {
		step string
		off  int64
		n    int
	}{{"park", 7, 1}, {"park", 17, 1}, {"handled", 7, 1}, {"parked-done", 7, 1}, {"handled", 17, 1}, {"dead-letter", 3, 1}, {"park", 7, 4}, {"parked-done", 7, 4}} {
		t.Run(fmt.Sprintf("%s-%d-concurrency-%d", c.step, c.off, c.n), func(t *testing.T) {
			t.Parallel()
			b := setup(t, 1)
			recs := keyedRecords(60, 10)
			recs[7].value = []byte("flaky")   // k7's first message: fails twice, then is applied
			recs[3].value = []byte("fail-me") // k3's first message: always fails, dead-lettered
			produce(t, b.brokers, b.topic, recs)
			s := childSpec{b: b, crashStep: c.step, crashOffset: c.off, crashMark: filepath.Join(t.TempDir(), "crashed"),
				runsFile: filepath.Join(t.TempDir(), "runs"), maxAttempts: 4, backoff: 50 * time.Millisecond, idle: 2 * time.Second,
				concurrency: c.n, park: true}
			if !s.runChild(t) {
				t.Fatalf("the child was not killed at step %s of offset %d", c.step, c.off)
			}
			if s.runChild(t) {
				t.Fatal("the restarted child was killed again")
			}
			b.checkExact(t, 60, []int64{3})
			if n := b.q(t, "SELECT count(*) FROM {{schema}}.key_parking"); n != 0 {
				t.Fatalf("%d messages left parked", n)
			}
			b.keyOrder(t, "k7", 6)
			b.keyOrder(t, "k3", 5)
		})
	}
}

// The bounds hold the partition instead of parking more, and lose nothing: a key at
// Park.MaxPerKey holds its next message (and at Concurrency 1 the partition) until its head
// is done; a new failing key past Park.MaxKeys is retried in place. Once the keys recover,
// everything is applied once, each key in order.
func TestParkBoundsHoldThePartition(t *testing.T) {
	for _, c := range []struct {
		name             string
		perKey, keys     int
		failing          []string
		appliedWhileDown int64 // offsets below the held message, the failing keys' aside
	}{
		{"max-per-key", 3, 0, []string{"k7"}, 34},   // k7's 7, 17, 27 parked; 37 held
		{"max-keys", 0, 1, []string{"k3", "k7"}, 6}, // k3 parked; k7's 7 retried in place
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 1)
			produce(t, b.brokers, b.topic, keyedRecords(50, 10))
			var down atomic.Bool
			down.Store(true)
			cfg := b.config(t)
			cfg.Park = ParkConfig{Enabled: true, MaxPerKey: c.perKey, MaxKeys: c.keys}
			cfg.Retry.MaxAttempts = 1000
			cfg.Breaker.Threshold = -1
			r := b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error {
				for _, k := range c.failing {
					if string(m.Key) == k && down.Load() {
						return errors.New("503")
					}
				}
				return applyEffect(ctx, tx, b.schema, m)
			}, cfg)
			r.waitFor(t, 60*time.Second, "the messages before the held one applied", func() bool {
				return b.q(t, "SELECT count(*) FROM {{schema}}.effects") == c.appliedWhileDown
			})
			time.Sleep(2 * time.Second)
			if n := b.q(t, "SELECT count(*) FROM {{schema}}.effects"); n != c.appliedWhileDown {
				t.Fatalf("%d applied while the bound holds, want %d", n, c.appliedWhileDown)
			}
			if n := b.q(t, "SELECT count(*) FROM {{schema}}.key_parking"); c.perKey > 0 && n != int64(c.perKey) || c.keys > 0 && n != 1 {
				t.Fatalf("%d parked past the bound", n)
			}
			down.Store(false)
			r.waitFor(t, 60*time.Second, "everything applied", func() bool {
				return b.q(t, "SELECT count(*) FROM {{schema}}.effects") == 50 && b.q(t, "SELECT count(*) FROM {{schema}}.key_parking") == 0
			})
			for _, k := range c.failing {
				b.keyOrder(t, k, 5)
			}
		})
	}
}

// A rebalance while a key is parked and its retrier runs: a second member joins, the first
// leaves; whoever owns the partition loads the parked key, parks its later messages behind
// it, and after the key recovers every message is applied once, the key's in offset order.
func TestParkedKeyAcrossARebalance(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, keyedRecords(50, 10))
	var down atomic.Bool
	down.Store(true)
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if string(m.Key) == "k4" && down.Load() {
			return errors.New("503")
		}
		return applyEffect(ctx, tx, b.schema, m)
	}
	a := b.start(t, h, b.config(t).withPark())
	a.waitFor(t, 60*time.Second, "45 applied, k4 parked", func() bool {
		return b.q(t, "SELECT count(*) FROM {{schema}}.effects") == 45 && b.q(t, "SELECT count(*) FROM {{schema}}.key_parking") == 5
	})
	bb := b.start(t, h, b.config(t).withPark())
	time.Sleep(3 * time.Second) // the group rebalances with both members
	produce(t, b.brokers, b.topic, keyedRecords(20, 10))
	if err := a.stop(t); err != nil {
		t.Fatal(err)
	}
	bb.waitFor(t, 60*time.Second, "the new messages of the other keys applied, k4's parked behind", func() bool {
		return b.q(t, "SELECT count(*) FROM {{schema}}.effects") == 63 && b.q(t, "SELECT count(*) FROM {{schema}}.key_parking") == 7
	})
	down.Store(false)
	bb.waitFor(t, 60*time.Second, "k4 applied", func() bool { return b.q(t, "SELECT count(*) FROM {{schema}}.effects") == 70 })
	b.keyOrder(t, "k4", 7)
}

// A parked message is not in flight for the offsets without a record (transaction markers):
// the watermark passes the commit marker after the records and reaches the log end while a
// message (a nil key: a key of its own) is still parked.
func TestParkedMessageDoesNotHoldTransactionMarkers(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produceTx(t, b.brokers, b.topic, true, "v0", "v1", "fail", "v3", "v4") // offsets 0-4; commit marker 5
	var down atomic.Bool
	down.Store(true)
	r := b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if string(m.Value) == "fail" && down.Load() {
			return errors.New("503")
		}
		return applyEffect(ctx, tx, b.schema, m)
	}, b.config(t).withPark())
	r.waitFor(t, 60*time.Second, "the watermark at the log end (6) while offset 2 is parked", func() bool {
		return b.q(t, "SELECT coalesce(max(next_offset), -1) FROM {{schema}}.watermarks") == 6 && b.q(t, "SELECT count(*) FROM {{schema}}.key_parking") == 1
	})
	if s := r.c.Stats(); s.InFlight != 1 {
		t.Fatalf("Stats.InFlight %d, want the 1 parked message", s.InFlight)
	}
	down.Store(false)
	r.waitFor(t, 60*time.Second, "all applied", func() bool { return b.q(t, "SELECT count(*) FROM {{schema}}.effects") == 5 })
}
