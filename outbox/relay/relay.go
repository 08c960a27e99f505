// Package relay publishes the rows of kafkatx's outbox table to Kafka (docs/design.md#invariant-7
// and "Outbox and relay"). Run it in-process (New, then Run) or as the `kafkatx relay`
// sidecar; both are the same code.
//
// Guarantees:
//   - A row is published only after its transaction committed (the relay reads committed rows
//     only) and is never skipped: the relay keeps no id cursor, it always reads the pending
//     rows, so a row that commits after a row with a higher id was published is still found.
//   - Rows with the same (topic, key) are published in commit order: the table's commit
//     trigger numbers transactions at commit under a per-key lock (docs/outbox-table.md), and
//     the relay publishes transactions in that order, each one's rows in write order, through
//     one idempotent producer (acks=all), which keeps the order of one partition on retries.
//   - A crash may publish a row again (after produce, before the row is marked), never lose
//     one; every record carries the row's kafkatx-outbox-id header, the same on every copy.
//   - One relay publishes an outbox at a time: the leader holds a session-level advisory lock
//     on a dedicated connection; standbys try the lock every StandbyInterval and take over
//     once the leader's session ends (process killed, connection lost). A session on a
//     read-only server (an old primary after a switchover, a standby) never leads: the leader
//     checks its session before every round and gives the leadership up (readonly.go).
//   - A record the broker refuses for good is parked with its error; later rows with the same
//     (topic, key) wait behind it, other keys flow. `kafkatx outbox release|discard` resolves it.
//
// The leader also runs the retention janitor (JanitorConfig) and refreshes the backlog gauges.
package relay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/pgerr"
	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/outbox"
	"github.com/kafkatx/kafkatx/pg"
)

// testSignals let a test act at named steps of one relay (River's testsignal). beforeMark
// runs after a round's delivery reports arrived and before the rows are marked: the window in
// which a crash publishes a record twice.
type testSignals struct {
	beforeMark func([]result)
	// inMark runs inside the mark's transaction, after its statements and before COMMIT:
	// the rows' locks are held.
	inMark func()
}

// Relay publishes one schema's outbox. Create it with New and start it with Run.
type Relay struct {
	signals testSignals // set by tests only
	pool    *pgxpool.Pool
	recycle pg.TimeoutRecycler // after a read cancelled by the session's statement_timeout
	cfg     *Config
	log     *zap.Logger
	t       tables.Names
	commits string  // quoted outbox_commits table
	channel string  // LISTEN channel, quoted
	hooks   hookSet // the Prometheus hook, then Config.Hooks
	c       counters
	running atomic.Bool
	// leading is the leadership session while this relay leads (lead's goroutine only).
	leading *leaderSession
	contact atomic.Int64 // unix nanoseconds of the last successful database round trip
	// failSince is when the rounds started failing (unix nanoseconds; 0: the last one
	// succeeded), failErr the last failure: Ready.
	failSince atomic.Int64
	failErr   atomic.Pointer[string]
	// prod is the leader's producer while this relay leads (nil otherwise): Ready reads
	// whether its brokers are all down.
	prod atomic.Pointer[producer]
	// fullRoundAt: unix nanoseconds when the leader's last round read a full batch; 0 when
	// the last round did not (Pending).
	fullRoundAt atomic.Int64

	// isolate holds row ids refused with a record-level error while batched: they are
	// produced one at a time until each is delivered or parked. Used by Run's goroutine only.
	isolate map[int64]bool
	// limits holds the byte budgets of topics whose max.message.bytes is below librdkafka's
	// batches (split.go). Run's goroutine only.
	limits     sizeLimits
	batchBytes int  // batchBytes(Config.Kafka)
	byMurmur2  bool // Config.Kafka's partitioner is murmur2 or murmur2_random (partitionOf)
	// topics tracks which topics exist for the current producer. Run's goroutine only.
	topics *topics
	// marker runs each round's mark in the background. Run's goroutine only.
	marker marker
	// ahead reads the next round's rows while a round produces. Run's goroutine only.
	ahead readAhead
	// testHookMaxMessageBytes, set by a test before Run, answers for the broker (split.go).
	testHookMaxMessageBytes func(topic string) (int, error)
	// testHookMark, set by a test before Run, runs in the mark's goroutine before it writes.
	testHookMark func()
	// unmarkable: rows whose mark PostgreSQL refused (markByRow), named by Ready.
	unmarkable unmarkable
}

// New returns a relay for pool's database. It checks cfg and starts nothing: Run does.
// It returns an error when cfg is nil or its Kafka settings are refused (see Config.Kafka),
// when Config.Registerer refuses a metric (one of the same name with other labels), or when a
// Config.Hooks value implements no Hook interface.
func New(pool *pgxpool.Pool, cfg *Config) (*Relay, error) {
	if pool == nil {
		return nil, errors.New("relay: nil pool")
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	// Refuse a configuration librdkafka refuses (an unknown property, a bad value) now,
	// instead of retrying it forever in Run. The client is closed at once.
	kp, err := kafka.NewProducer(&c.Kafka)
	if err != nil {
		return nil, fmt.Errorf("relay: Kafka configuration: %w", err) // names the setting, never its value
	}
	kp.Close()
	prom, err := newPromHook(c.Registerer, c.Schema)
	if err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	hooks, err := newHookSet([]Hook{prom}, c.Hooks)
	if err != nil {
		return nil, err
	}
	rl := &Relay{
		pool:       pool,
		cfg:        c,
		log:        c.Logger,
		t:          tables.For(c.Schema),
		commits:    tables.For(c.Schema).OutboxCommits,
		channel:    pgx.Identifier{outbox.Channel(c.Schema)}.Sanitize(),
		hooks:      hooks,
		isolate:    map[int64]bool{},
		limits:     sizeLimits{},
		batchBytes: batchBytes(c.Kafka),
		byMurmur2:  byMurmur2(c.Kafka),
	}
	rl.marker.r = rl
	rl.ahead.r = rl
	return rl, nil
}

// Stats returns the relay's counters.
func (r *Relay) Stats() Stats {
	return Stats{
		Published:   r.c.published.Load(),
		Parked:      r.c.parked.Load(),
		Retried:     r.c.retried.Load(),
		Leader:      r.c.leader.Load(),
		LastContact: time.Unix(0, r.contact.Load()),
	}
}

// touch records a successful database round trip (a round, a standby's lock check): the
// relay is not failing.
func (r *Relay) touch() {
	r.contact.Store(time.Now().UnixNano())
	r.failSince.Store(0)
}

// failing records a failed round or session: the relay cannot publish since the first
// failure after its last success.
func (r *Relay) failing(err error) {
	r.failSince.CompareAndSwap(0, time.Now().UnixNano())
	s := pg.SanitizeText(err.Error(), 512)
	r.failErr.Store(&s)
}

// NotReadyAfter is how long the relay's rounds (or its database session) may fail in a row,
// with no success between, or a leader's brokers all be down, before Ready reports it.
const NotReadyAfter = 10 * time.Second

// Ready returns nil unless the relay cannot publish, and then an error naming since when and
// why: it has failed every round (or its database session) for NotReadyAfter or longer with
// no success between — it cannot read or mark the outbox — or, while it leads, librdkafka has
// reported every broker down for NotReadyAfter with none answering since (also when the
// outbox is empty: nothing written now would be published) — or, within the last minute, it
// could not mark a row that PostgreSQL refused to mark (park it, say), which then stays
// pending while the other rows are marked: the error names the row. A standby is ready. For
// a readiness probe of the process that runs it (kafkatx.Consumer.AddReadinessCheck); safe
// from any goroutine.
func (r *Relay) Ready(context.Context) error {
	if n := r.failSince.Load(); n != 0 && time.Since(time.Unix(0, n)) >= NotReadyAfter {
		msg := ""
		if p := r.failErr.Load(); p != nil {
			msg = *p
		}
		return fmt.Errorf("the outbox relay cannot publish: every round has failed since %s: %s", time.Unix(0, n).UTC().Format(time.RFC3339), msg)
	}
	if p := r.prod.Load(); p != nil {
		if err := p.reach.NotReady(NotReadyAfter); err != nil {
			return fmt.Errorf("the outbox relay cannot publish: %w", err)
		}
	}
	if why := r.unmarkable.notReady(); why != "" {
		return fmt.Errorf("the outbox relay cannot mark a row: %s", why)
	}
	return nil
}

// Run campaigns for the outbox's leadership and, while it holds it, publishes; it returns
// nil once ctx is cancelled and every record already produced was confirmed and marked (or
// Config.ShutdownTimeout passed). Database and broker outages are logged and retried, never
// returned. It returns an error only when called twice at once.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("relay: Run is already running")
	}
	defer r.running.Store(false)
	// The backlog gauges in every relay, the standbys' too: a standby beside a leader that
	// publishes nothing (an older release that does not read packed rows, one stuck) is where
	// an operator looks, and it read 0 while records waited (a fresh-eyes attack).
	gctx, stopGauges := context.WithCancel(ctx)
	gdone := make(chan struct{})
	go func() { defer close(gdone); r.refreshGauges(gctx) }()
	defer func() { stopGauges(); <-gdone }()
	wait := r.cfg.InitialBackoff
	for ctx.Err() == nil {
		err := r.session(ctx)
		if ctx.Err() != nil {
			break
		}
		if err != nil {
			r.failing(err)
			r.log.Warn("relay database session ended; reconnecting", zap.Error(err), zap.Duration("backoff", wait))
		}
		if !sleep(ctx, wait) {
			break
		}
		wait = min(wait*2, r.cfg.MaxBackoff)
	}
	return nil
}

// session opens the dedicated connection that holds (or waits for) the leadership lock and
// campaigns on it until it fails or ctx is cancelled.
func (r *Relay) session(ctx context.Context) error {
	cc := r.cfg.Session
	if cc == nil {
		cc = r.pool.Config().ConnConfig
	}
	conn, err := pgx.ConnectConfig(ctx, cc.Copy())
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx) // ends the session: the lock, if held, is released
	}()
	// Leadership is a session-level lock: never campaign through a transaction pooler.
	if err := pg.RequireSession(ctx, conn); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("leadership session: %w; set relay.Config.Session to a connection that reaches PostgreSQL directly or through a session pooler", err)
	}
	standbyLogged := false
	for {
		// Never campaign on a read-only server (readonly.go): the lock is taken only when
		// the session accepts writes.
		var ro, got bool
		err := conn.QueryRow(ctx, `SELECT current_setting('transaction_read_only') = 'on',
			current_setting('transaction_read_only') <> 'on' AND pg_try_advisory_lock(hashtextextended($1, 0))`, LeadershipLockKey(r.cfg.Schema)).Scan(&ro, &got)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("try leadership lock: %w", err)
		}
		r.touch()
		if ro {
			return fmt.Errorf("leadership session: %w", errReadOnly)
		}
		if got {
			return r.lead(ctx, conn)
		}
		if !standbyLogged {
			r.log.Info("another relay leads this outbox; standing by", zap.String("schema", r.cfg.Schema))
			standbyLogged = true
		}
		if !sleep(ctx, r.cfg.StandbyInterval) {
			return nil
		}
	}
}

// lead publishes while conn (which holds the leadership lock) is alive and ctx is not done.
func (r *Relay) lead(ctx context.Context, conn *pgx.Conn) error {
	if _, err := conn.Exec(ctx, "LISTEN "+r.channel); err != nil {
		return fmt.Errorf("listen %s: %w", r.channel, err)
	}
	if err := r.armLeaderTimeout(ctx, conn); err != nil {
		return err
	}
	sess := &leaderSession{conn: conn, at: time.Now()}
	r.leading = sess
	defer func() { r.leading = nil }()
	r.log.Info("relay is the leader; publishing", zap.String("schema", r.cfg.Schema))
	r.leadership(true)
	defer r.leadership(false)
	defer r.fullRoundAt.Store(0)

	p, err := newProducer(r.cfg.Kafka, r.log)
	if err != nil {
		return err
	}
	r.prod.Store(p)
	defer func() { r.prod.Store(nil); p.close() }()
	r.topics = newTopics()
	defer r.marker.finish(r.cfg.ShutdownTimeout)
	defer r.ahead.drop()

	bg, stopBG := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stopBG(); wg.Wait() }()
	if !r.cfg.Janitor.Disabled {
		wg.Add(1)
		go func() { defer wg.Done(); r.runJanitor(bg) }()
	}

	// Fencing: a round produces only once the lock's session answered and is still writable,
	// checked after the round's read and right before it produces (one round trip per
	// round), so a deposed leader — its session ended, or left on an old primary after a
	// switchover — publishes nothing read after it was deposed. A round that produced
	// nothing did not check: the next loop checks first, so an idle leader notices too.
	fence := sess.fence
	wait := time.Duration(0)
	fenced := false
	for ctx.Err() == nil {
		if !fenced {
			if err := fence(ctx); err != nil {
				return lostLeadership(ctx, err)
			}
		}
		if p.fatal.Load() {
			r.log.Error("producer hit a fatal error; creating a new one")
			p.close()
			if p, err = newProducer(r.cfg.Kafka, r.log); err != nil {
				return err
			}
			r.prod.Store(p)
			r.topics = newTopics()
		}
		res, err := r.round(ctx, p, fence)
		fenced = res.fenced
		if err == nil && res.full {
			r.fullRoundAt.Store(time.Now().UnixNano())
		} else {
			r.fullRoundAt.Store(0)
		}
		if err != nil && ctx.Err() == nil {
			r.failing(err)
		}
		switch {
		case err != nil && ctx.Err() != nil:
			return nil
		case errors.Is(err, errFenced):
			return lostLeadership(ctx, err)
		case err != nil && readOnlyServer(err):
			// Discard the pool's sessions (they would be refused for ever); the next round
			// checks the leadership session itself.
			r.pool.Reset()
			r.log.Warn("relay round failed: a write was refused by a read-only server; the pool's connections were discarded", zap.Error(err))
		case err != nil && pgerr.Classify(err) == pgerr.Server:
			// The server's own condition (docs/failures.md): the round is run again after the
			// backoff, as every failed round is; the log names the condition.
			r.log.Warn("relay round failed: the database's own condition; waiting it out", zap.Stringer("condition", pgerr.Describe(err)), zap.Error(err))
		case err != nil:
			r.log.Warn("relay round failed", zap.Error(err))
		default:
			r.touch()
		}
		if err != nil || res.retry {
			wait = max(r.cfg.InitialBackoff, min(wait*2, r.cfg.MaxBackoff))
			if !r.sleepLeading(ctx, wait) && ctx.Err() != nil {
				return nil
			}
		} else {
			wait = 0
		}
		if err == nil && res.full {
			continue // more rows wait: go on at once
		}
		wctx, cancel := context.WithTimeout(ctx, min(r.cfg.PollInterval, r.keepaliveEvery())) // the loop fences before the next round
		_, err = conn.WaitForNotification(wctx)
		cancel()
		if err != nil && !pgconn.Timeout(err) && !errors.Is(err, context.DeadlineExceeded) {
			return lostLeadership(ctx, err)
		}
	}
	return nil
}

func lostLeadership(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("leadership connection lost: %w", err)
}

// sleep waits d or until ctx is done; it reports whether ctx is still alive.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Totals are Stats' published, parked and retried counts by name (relays.Relay).
func (r *Relay) Totals() map[string]int64 {
	s := r.Stats()
	return map[string]int64{"published": s.Published, "parked": s.Parked, "retried": s.Retried}
}
