package kafkatx

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/engine"
	"github.com/kafkatx/kafkatx/shards"
)

// Consumer is the effectively-once consumer loop: per batch of a partition, the handler's
// effects, the watermark advance and any dead letter commit in one PostgreSQL transaction,
// and only then is the Kafka offset committed. Create one with NewConsumer and start it with
// Run. The loop itself is internal/engine's; Consumer is its public face.
type Consumer struct {
	pool    *pgxpool.Pool
	set     *engine.Settings
	skipMig bool
	shards  *shards.Set // Config.Shards
	loop    *engine.Loop
	metrics *promHook // also in the hooks; kept for tests that read a metric
	stats   counters
	running atomic.Bool
	checks  readinessChecks // AddReadinessCheck
	relays  *shardRelays    // with Config.Shards: is each shard relayed (shard_relays.go)
}

// NewConsumer validates cfg and returns a Consumer that runs handler once per message.
// It starts nothing and opens no connection; Run does.
func NewConsumer(pool *pgxpool.Pool, handler Handler, cfg *Config) (*Consumer, error) {
	if handler == nil {
		return nil, errors.New("kafkatx: nil Handler")
	}
	return newConsumer(pool, perMessage(handler), cfg)
}

// NewBatchConsumer is NewConsumer for a BatchHandler.
func NewBatchConsumer(pool *pgxpool.Pool, handler BatchHandler, cfg *Config) (*Consumer, error) {
	if handler == nil {
		return nil, errors.New("kafkatx: nil BatchHandler")
	}
	return newConsumer(pool, handler, cfg)
}

func newConsumer(pool *pgxpool.Pool, handler BatchHandler, cfg *Config) (*Consumer, error) {
	if pool == nil {
		return nil, errors.New("kafkatx: nil *pgxpool.Pool")
	}
	set, err := cfg.settings()
	if err != nil {
		return nil, err
	}
	d := cfg.WithDefaults()
	prom, err := newPromHook(d.Registerer)
	if err != nil {
		return nil, fmt.Errorf("kafkatx: %w", err)
	}
	hooks, err := newHookSet([]Hook{prom}, d.Hooks)
	if err != nil {
		return nil, err
	}
	chained, err := Chain(handler, d.Middleware...)
	if err != nil {
		return nil, err
	}
	c := &Consumer{pool: pool, set: set, skipMig: d.SkipMigrations, metrics: prom, shards: d.Shards}
	emit := &emitter{group: set.Group, log: set.Logger.With(zap.String("group", set.Group)), hooks: hooks, stats: &c.stats}
	body := newBody(withGroup(chained, set.Group), d.Idempotency, set.Schema)
	body.Prepare, body.PrepareLimit = d.Prepare, d.PrepareLimit
	c.loop = engine.New(pool, body, set, emit)
	prom.watchParked(set.Group, c.loop)
	if d.Shards != nil {
		c.relays = newShardRelays(d.Shards, set.Schema, prom.c.ShardRelayUnowned, set.Logger.With(zap.String("group", set.Group)))
		c.AddReadinessNote("shard relays", c.relays.note)
	}
	return c, nil
}

// Stats returns a snapshot of the consumer's counters. Safe to call from any goroutine.
func (c *Consumer) Stats() Stats {
	snap := c.loop.Snapshot()
	s := c.stats.load()
	s.FirstAssignedAt, s.LastMessageAt = snap.FirstAssigned, snap.LastMessage
	s.Assigned, s.InFlight, s.HeldBack, s.Waiting = snap.Assigned, snap.InFlight, snap.HeldBack, len(snap.Waiting)
	return s
}

// Run joins the consumer group and processes messages until ctx is cancelled or a fatal
// error occurs. In order, it:
//
//  1. applies kafkatx's embedded migrations to Config.Schema under an advisory lock (or,
//     with Config.SkipMigrations, only checks that they are applied); a database that is not
//     ready — restarting, out of connection slots, not accepting connections, its sessions
//     ended meanwhile (pgstart.NotYet) — is waited for, for pgstart.Within (60 s), logged at
//     warn level (pgstart.Retry), as the loop rides out an outage once it runs;
//  2. creates the librdkafka consumer and subscribes to Config.Topics;
//  3. on each assignment reconciles the database watermark with Kafka's committed offset
//     (docs/offsets.md) and starts one worker per partition;
//  4. on cancellation stops polling, lets in-flight transactions finish within
//     Config.ShutdownTimeout (then aborts them), commits the final offsets and leaves the
//     group (a static member, with group.instance.id, stays until its session times out).
//
// It returns nil after a clean shutdown, or:
//   - *MigrationsMissingError: Config.SkipMigrations is set and the schema lacks versions;
//   - an error wrapping the migration, consumer-creation or subscription failure (a
//     database not ready for pgstart.Within says that it waited);
//   - *OffsetAheadError: Kafka's offset is ahead of the watermark under AheadHalt;
//   - *LogRangeError: a watermark is past its partition's log end (topic recreated or
//     truncated);
//   - an error wrapping a fatal kafka.Error (librdkafka's IsFatal);
//   - an error naming a partition whose worker stopped on an unexpected error.
//
// Calling Run twice returns an error.
//
// Closing the Kafka client takes at most Config.CloseTimeout more. A fatal librdkafka error
// (for example a static member fenced by another process with its group.instance.id) is
// returned wrapped as "kafkatx: fatal Kafka error: ...". Authentication failures are not
// fatal: librdkafka retries them, and Readiness reports them with the time they started.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("kafkatx: Consumer.Run called twice")
	}
	for _, pool := range c.pools() {
		if err := prepareSchema(ctx, pool, c.set.Schema, c.skipMig, c.set.Logger.With(zap.String("group", c.set.Group))); err != nil {
			return err
		}
	}
	if c.relays != nil {
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); c.relays.run(wctx) }()
		defer func() { cancel(); <-done }()
	}
	return c.loop.Run(ctx)
}
