package kafkatx

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/engine"
)

// Tests of Config.Concurrency (per-key lanes): each fails without the guarantee it names.

// TestLanesRunKeysConcurrentlyInKeyOrder: 8 keys × 10 messages on one partition, a 40 ms
// handler, Concurrency 8. Never two messages of one key in flight; each key's offsets applied
// in order; the drain takes well under the serial bound (80 × 40 ms = 3.2 s); a failing
// message in backoff holds only its key's lane (the other keys finish meanwhile); watermark
// and Kafka's offset end at the log end and done_offsets is empty.
func TestLanesRunKeysConcurrentlyInKeyOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	var recs []testRecord
	for i := 0; i < 80; i++ {
		v := fmt.Sprint(i)
		if i == 3 {
			v = "fail-twice"
		}
		recs = append(recs, testRecord{key: []byte(fmt.Sprintf("key-%d", i%8)), value: []byte(v), partition: 0})
	}
	produce(t, b.brokers, b.topic, recs)
	var mu sync.Mutex
	inFlight := map[string]int{}
	keysInFlight, maxKeysInFlight := 0, 0 // distinct keys in their handler at once
	last := map[string]int64{}
	var problems []string
	var failedAt, othersDoneAt time.Time
	doneOthers := 0
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		k := string(m.Key)
		mu.Lock()
		inFlight[k]++
		if inFlight[k] == 1 {
			keysInFlight++
			maxKeysInFlight = max(maxKeysInFlight, keysInFlight)
		}
		if inFlight[k] > 1 {
			problems = append(problems, fmt.Sprintf("two messages of %s in flight (offset %d)", k, m.Offset))
		}
		if l, ok := last[k]; ok && m.Offset < l {
			problems = append(problems, fmt.Sprintf("%s: offset %d after %d", k, m.Offset, l))
		}
		mu.Unlock()
		defer func() {
			mu.Lock()
			if inFlight[k]--; inFlight[k] == 0 {
				keysInFlight--
			}
			mu.Unlock()
		}()
		time.Sleep(40 * time.Millisecond)
		if string(m.Value) == "fail-twice" && m.Attempt < 3 {
			mu.Lock()
			failedAt = time.Now()
			mu.Unlock()
			return errors.New("fails twice")
		}
		if err := applyEffect(ctx, tx, b.schema, m); err != nil {
			return err
		}
		mu.Lock()
		last[k] = m.Offset
		if k != "key-3" {
			doneOthers++
			if doneOthers == 70 {
				othersDoneAt = time.Now()
			}
		}
		mu.Unlock()
		return nil
	}
	cfg := b.config(t)
	cfg.Concurrency = 8
	cfg.Batch.Size = 1
	// Backoffs long beside the other keys' work, so that "before the failing key's last try"
	// holds on a loaded machine too, and is only broken by a backoff that holds them.
	cfg.Retry = RetryPolicy{InitialBackoff: 5 * time.Second, MaxBackoff: 5 * time.Second, Multiplier: 1}
	start := time.Now()
	r := b.start(t, h, cfg)
	waitFor(t, 60*time.Second, "80 effects", func() bool { return b.q(t, "SELECT count(*) FROM {{schema}}.effects") == 80 })
	took := time.Since(start)
	waitFor(t, 30*time.Second, "watermark and Kafka at 80", func() bool {
		return b.q(t, "SELECT next_offset FROM {{schema}}.watermarks") == 80 && b.committedOffsets(t, 1)[0] == 80
	})
	_ = r.stop(t)
	mu.Lock()
	defer mu.Unlock()
	for _, p := range problems {
		t.Error(p)
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.effects WHERE applied <> 1"); n != 0 {
		t.Fatalf("%d duplicate effects", n)
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.done_offsets"); n != 0 {
		t.Errorf("%d done_offsets rows left below the watermark", n)
	}
	// The failing key's two backoffs (10 s) hold only its lane: the 70 messages of the other
	// keys finish before it is retried for the last time (its last failure plus a backoff).
	if othersDoneAt.IsZero() || !othersDoneAt.Before(failedAt.Add(cfg.Retry.InitialBackoff)) {
		t.Errorf("the other keys finished at %v, the failing key's last failure at %v: a backoff held them", othersDoneAt.Sub(start), failedAt.Sub(start))
	}
	t.Logf("80 messages of 8 keys at 40 ms each with Concurrency 8: %s (serial: 3.2 s plus 10 s of backoff), up to %d keys in their handlers at once", took, maxKeysInFlight)
	// Concurrency shown by what ran at once, not by a duration a loaded machine stretches: each
	// handler holds its key for 40 ms, so lanes that run side by side overlap.
	if maxKeysInFlight < 2 {
		t.Errorf("never two keys in their handlers at once (took %s): the keys did not run concurrently", took)
	}
}

// TestLanesSIGKILLAtEachStepLeavesAnExactEndState is the crash test with Concurrency 4 over
// 60 keyed messages: a SIGKILL at each step of the loop, then a restart with another
// Concurrency (2: N changed between runs), leaves every effect applied once, the poison pill
// dead-lettered once, watermark and Kafka's offset at the end. Without done_offsets (or its
// skip on restart), units that committed above the watermark run again: applied = 2.
func TestLanesSIGKILLAtEachStepLeavesAnExactEndState(t *testing.T) {
	t.Parallel()
	requireServices(t)
	for _, step := range []string{"polled", "handled", "db-committed", "dead-letter"} {
		t.Run(step, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 1)
			produce(t, b.brokers, b.topic, values(60, 0, func(i int) string {
				if i == 10 {
					return "poison"
				}
				return fmt.Sprint(i)
			}))
			off := int64(40)
			if step == "dead-letter" {
				off = 10
			}
			s := childSpec{b: b, crashStep: step, crashOffset: off, crashMark: filepath.Join(t.TempDir(), "crashed"), maxAttempts: 5,
				backoff: 50 * time.Millisecond, idle: 2 * time.Second, concurrency: 4, slow: 20 * time.Millisecond}
			if !s.runChild(t) {
				t.Fatalf("the child was not killed at step %s", step)
			}
			above := b.q(t, "SELECT count(*) FROM {{schema}}.done_offsets")
			t.Logf("after the kill at %s: %d offsets done above the watermark %d", step, above, b.q(t, "SELECT next_offset FROM {{schema}}.watermarks"))
			s.concurrency = 2
			if s.runChild(t) {
				t.Fatal("the restarted child was killed again")
			}
			b.checkExact(t, 60, []int64{10})
			if n := b.q(t, "SELECT count(*) FROM {{schema}}.done_offsets"); n != 0 {
				t.Errorf("%d done_offsets rows left", n)
			}
		})
	}
}

// TestLaneOfSpreadsKeys: a partition's few dozen keys over 32 lanes by FNV-1a: every lane
// gets keys, and the busiest holds at most a few times the average.
func TestLaneOfSpreadsKeys(t *testing.T) {
	for _, keys := range []int{40, 400} {
		count := make([]int, 32)
		for i := 0; i < keys; i++ {
			count[engine.LaneOf([]byte(fmt.Sprintf(`{"id":%d}`, i)), int64(i), 32)]++
		}
		busiest, empty := 0, 0
		for _, c := range count {
			busiest = max(busiest, c)
			if c == 0 {
				empty++
			}
		}
		avg := float64(keys) / 32
		t.Logf("%d keys over 32 lanes: busiest %d (%.1fx the average %.1f), %d lanes empty", keys, busiest, float64(busiest)/avg, avg, empty)
		if float64(busiest) > 4*avg+2 {
			t.Errorf("%d keys: the busiest lane holds %d, over 4x the average %.1f", keys, busiest, avg)
		}
	}
}

// TestLanesMembersJoiningAndLeavingMidStreamApplyEachRecordOnce: 4,000 keyed records over 4
// partitions, Concurrency 4. A second member joins at a quarter, the first leaves at a half
// (its revocation waits for every unit in flight, then commits the watermark over what they
// did); every record is applied once and done_offsets ends empty.
func TestLanesMembersJoiningAndLeavingMidStreamApplyEachRecordOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	const n = 4000
	produce(t, b.brokers, b.topic, values(n, -1, func(i int) string { return fmt.Sprint(i) }))
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		time.Sleep(time.Millisecond)
		return applyEffect(ctx, tx, b.schema, m)
	}
	cfg := func() *Config {
		c := b.config(t)
		c.Concurrency, c.Batch.Size = 4, 20
		return c
	}
	a := b.start(t, h, cfg())
	waitFor(t, 60*time.Second, "a quarter processed", func() bool { return b.q(t, "SELECT count(*) FROM {{schema}}.effects") >= n/4 })
	bb := b.start(t, h, cfg())
	waitFor(t, 120*time.Second, "half processed", func() bool { return b.q(t, "SELECT count(*) FROM {{schema}}.effects") >= n/2 })
	if err := a.stop(t); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 120*time.Second, "all processed", func() bool { return b.q(t, "SELECT count(*) FROM {{schema}}.effects") == n })
	waitFor(t, 60*time.Second, "watermarks at the log end", func() bool {
		return b.q(t, "SELECT coalesce(sum(next_offset), 0) FROM {{schema}}.watermarks") == n
	})
	_ = bb.stop(t)
	if d := b.q(t, "SELECT count(*) FROM {{schema}}.effects WHERE applied <> 1"); d != 0 {
		t.Fatalf("%d duplicate effects after members joined and left", d)
	}
	if d := b.q(t, "SELECT count(*) FROM {{schema}}.done_offsets"); d != 0 {
		t.Fatalf("%d done_offsets rows left", d)
	}
}

// TestLanesZombieIsFencedPerUnit: Concurrency 4; every unit holding an offset below 8 is
// frozen inside its transaction while another owner moves the watermark to 8. Released, each
// of those units is refused (its offsets are below the watermark: MarkDoneXID fences it) and
// rolls back; the worker re-reads the watermark and goes on from 8: no effect below 8, every
// offset from 8 applied once.
func TestLanesZombieIsFencedPerUnit(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, values(40, 0, func(i int) string { return fmt.Sprint(i) }))
	release := make(chan struct{})
	var entered sync.WaitGroup
	entered.Add(1)
	var once sync.Once
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if err := applyEffect(ctx, tx, b.schema, m); err != nil {
			return err
		}
		if m.Offset < 8 {
			once.Do(entered.Done)
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
	cfg := b.config(t)
	cfg.Concurrency = 4
	// The consumer's own pool: four units frozen in their transactions hold four
	// connections, and the test's statements need one.
	pc, err := pgxpool.ParseConfig(b.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	c, err := NewConsumer(pool, h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := run(t, c)
	entered.Wait()
	time.Sleep(300 * time.Millisecond) // the other lanes reach their offsets below 8 too
	b.exec(t, "UPDATE {{schema}}.watermarks SET next_offset = 8, updated_at = now()")
	close(release)
	waitFor(t, 60*time.Second, "watermark 40", func() bool {
		return b.q(t, "SELECT coalesce(max(next_offset), 0) FROM {{schema}}.watermarks") == 40
	})
	_ = r.stop(t)
	if n := b.q(t, `SELECT count(*) FROM {{schema}}.effects WHERE "offset" < 8`); n != 0 {
		t.Fatalf("fenced units committed %d effects below the other owner's watermark", n)
	}
	if n := b.q(t, `SELECT count(*) FROM {{schema}}.effects WHERE "offset" >= 8 AND applied = 1`); n != 32 {
		t.Fatalf("%d effects at or above the new watermark applied once, want 32", n)
	}
}
