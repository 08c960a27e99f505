package relay

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
)

// Issue "outages" 3: a relay that failed every round (statement_timeout, a missing table) was
// invisible to the readiness of the process that ran it. Ready reports it once the rounds have
// failed for NotReadyAfter with no success between, naming the failure, and clears at the
// next successful round.
func TestReadyReportsARelayThatCannotRead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testenv.Topic(t, b.brokers, 1)
	r, _ := b.start(t, b.config(t))
	b.write(t, outbox.Record{Topic: topic, Key: []byte("k"), Value: []byte("v")})
	waitFor(t, 30*time.Second, "the first record published", func() bool { return r.Stats().Published >= 1 })
	if err := r.Ready(context.Background()); err != nil {
		t.Fatalf("Ready while publishing: %v", err)
	}
	ctx := context.Background()
	outboxT := pgx.Identifier{b.schema, "outbox"}.Sanitize()
	if _, err := b.pool.Exec(ctx, `ALTER TABLE `+outboxT+` RENAME TO outbox_away`); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	waitFor(t, 60*time.Second, "Ready reporting the failing rounds", func() bool { return r.Ready(ctx) != nil })
	if waited := time.Since(start); waited < NotReadyAfter-time.Second {
		t.Fatalf("not ready after %s of failures; want about NotReadyAfter (%s)", waited, NotReadyAfter)
	}
	if err := r.Ready(ctx); !strings.Contains(err.Error(), "cannot publish") || !strings.Contains(err.Error(), "outbox") {
		t.Fatalf("Ready: %v; want it to say the relay cannot publish and why", err)
	}
	if _, err := b.pool.Exec(ctx, `ALTER TABLE `+pgx.Identifier{b.schema, "outbox_away"}.Sanitize()+` RENAME TO outbox`); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "ready again after a successful round", func() bool { return r.Ready(ctx) == nil })
}

// A read of pending rows that never answers (here: a lock held on outbox_commits; in the
// field, a plan gone bad that ran for minutes with nothing logged) is cancelled after
// Config.ReadTimeout and fails the round like any database error, so the relay says so —
// Ready names it after NotReadyAfter — instead of holding silently; once the read answers
// again the rows are published.
func TestReadThatNeverAnswersIsCancelledAndReported(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testenv.Topic(t, b.brokers, 1)
	cfg := b.config(t)
	cfg.ReadTimeout = 300 * time.Millisecond
	r, _ := b.start(t, cfg)
	b.write(t, outbox.Record{Topic: topic, Key: []byte("k"), Value: []byte("v")})
	waitFor(t, 30*time.Second, "the first record published", func() bool { return r.Stats().Published >= 1 })
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `LOCK TABLE `+pgx.Identifier{b.schema, "outbox_commits"}.Sanitize()+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "Ready reporting the read that does not answer", func() bool { return r.Ready(ctx) != nil })
	if err := r.Ready(ctx); !strings.Contains(err.Error(), "ReadTimeout") {
		t.Fatalf("Ready: %v; want it to name the read that ran past ReadTimeout", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	b.write(t, outbox.Record{Topic: topic, Key: []byte("k"), Value: []byte("v2")})
	waitFor(t, 60*time.Second, "the record written after the lock published", func() bool { return r.Stats().Published >= 2 })
	waitFor(t, 60*time.Second, "ready again", func() bool { return r.Ready(ctx) == nil })
}

// A connection keeps the statement_timeout its session was opened with: after a database
// default of 1 ms was set back, the relay's connections opened in that window kept failing
// every read for as long as the pool kept them (a fresh user's attack: 74 s and counting,
// until the backends were terminated). The relay recycles its pool's connections after a read
// the session's statement_timeout cancelled, so the next ones take the default in force then.
// Sessions here get the 1 ms while short is set, as ALTER DATABASE … SET does for new ones;
// the relay starts inside that window with 5,000 rows to publish (a 1,000-row read takes
// 2–10 ms, past 1 ms).
func TestConnectionsOpenedUnderAShortStatementTimeoutAreRecycled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testenv.Topic(t, b.brokers, 1)
	ctx := context.Background()
	var short atomic.Bool
	pc, err := pgxpool.ParseConfig(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	pc.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		if short.Load() {
			_, err := c.Exec(ctx, `SET statement_timeout = '1ms'`)
			return err
		}
		return nil
	}
	rp, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rp.Close)
	recs := make([]outbox.Record, 5000)
	for i := range recs {
		recs[i] = outbox.Record{Topic: topic, Key: fmt.Appendf(nil, "k%d", i%50), Value: bytes.Repeat([]byte("v"), 200)}
	}
	b.write(t, recs...)
	short.Store(true)
	r, err := New(rp, b.config(t))
	if err != nil {
		t.Fatal(err)
	}
	b.run(t, r)
	time.Sleep(3 * time.Second) // rounds fail: statement timeout
	short.Store(false)          // the default set back; the sessions already open keep 1 ms
	waitFor(t, 90*time.Second, "all 5,000 rows published after the default was set back", func() bool { return r.Stats().Published >= 5000 })
}

// A leader whose brokers are all unreachable was ready as long as its rounds did not fail:
// with an empty outbox (or one it could read and not publish) /readyz of `kafkatx relay`
// answered 200 while nothing written could be published. Ready now reports it once
// librdkafka has reported every broker down for NotReadyAfter, and clears when one answers.
func TestReadyReportsALeaderThatCannotReachKafka(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testenv.Topic(t, b.brokers, 1)
	addr := testenv.FreeAddr(t) // nothing listens there yet
	cfg := b.config(t)
	cfg.Kafka["bootstrap.servers"] = addr
	cfg.Kafka["reconnect.backoff.max.ms"] = 1000
	r, _ := b.start(t, cfg)
	ctx := context.Background()
	waitFor(t, 30*time.Second, "leadership", func() bool { return r.Stats().Leader })
	start := time.Now()
	waitFor(t, 60*time.Second, "Ready reporting the unreachable brokers", func() bool { return r.Ready(ctx) != nil })
	if waited := time.Since(start); waited < NotReadyAfter-time.Second {
		t.Fatalf("not ready after %s; want about NotReadyAfter (%s) of the brokers being down", waited, NotReadyAfter)
	}
	if err := r.Ready(ctx); !strings.Contains(err.Error(), "Kafka unreachable since") {
		t.Fatalf("Ready: %v; want it to name Kafka unreachable", err)
	}
	testenv.Forward(t, addr, strings.Split(b.brokers, ",")[0]) // the broker "comes back"
	waitFor(t, 60*time.Second, "ready once a broker answers", func() bool { return r.Ready(ctx) == nil })
	b.write(t, outbox.Record{Topic: topic, Key: []byte("k"), Value: []byte("v")})
	waitFor(t, 60*time.Second, "the record published", func() bool { return r.Stats().Published >= 1 })
}
