package kafkatx

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/handlercall"
	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/pg"
)

// Handler processes one message inside the transaction that also advances the partition's
// watermark. It must do its database work through tx; tx.Commit and tx.Rollback return
// ErrTxOwnedByLoop and count as its failure (tx.Begin opens a savepoint). Returning an error
// rolls the transaction back; the message is retried with backoff until
// Config.Retry.MaxAttempts, then dead-lettered. Return Permanent(err) to dead-letter at once.
// The transaction is run again without counting an attempt only when ctx is done (shutdown,
// a lost partition), the error holds a retryable PostgreSQL SQLSTATE (40001, 40P01, 55P03,
// 25P03, 57P05, 25006, 57P0x, 08xxx), or tx's connection was lost and the error is not the
// handler's own context ending; the handler's own timeout or cancellation (a context it
// derived from ctx) and its own network errors are attempts. A panic is recovered and counted
// as an attempt.
type Handler func(ctx context.Context, tx pgx.Tx, m *Message) error

// BatchHandler processes messages of one partition, in offset order, inside the one
// transaction that also advances the watermark past them — for bulk writes (COPY or a
// multi-row INSERT). It may be called with any contiguous run of messages, down to one: when
// a batch fails, kafkatx rolls it back and isolates the failing message. Return
// FailMessage(m, err) to name the message that failed (its neighbours are re-run as a batch
// without it); any other error makes kafkatx re-run the batch one message per transaction to
// find it. Retry, Permanent and panic rules are those of Handler.
type BatchHandler func(ctx context.Context, tx pgx.Tx, msgs []*Message) error

// MessageError names the message of a batch that failed. Create one with FailMessage.
type MessageError struct {
	Offset int64
	Err    error
}

func (e *MessageError) Error() string { return fmt.Sprintf("offset %d: %v", e.Offset, e.Err) }
func (e *MessageError) Unwrap() error { return e.Err }

// FailMessage ties err to message m of a batch, so that only m is retried or
// dead-lettered. Wrap err with Permanent to dead-letter m at once.
func FailMessage(m *Message, err error) error {
	if err == nil {
		return nil
	}
	return &MessageError{Offset: m.Offset, Err: err}
}

// Consumer is the effectively-once consumer loop: per batch of a partition, the handler's
// effects, the watermark advance and any dead letter commit in one PostgreSQL transaction,
// and only then is the Kafka offset committed. Create one with NewConsumer and start it with
// Run.
type Consumer struct {
	pool    *pgxpool.Pool
	handler BatchHandler
	cfg     *Config
	group   string
	store   *offsetstore.Store
	log     *zap.Logger
	hooks   hookSet
	metrics *promHook // also in hooks; kept for tests that read a metric
	stats   counters

	running atomic.Bool
	failed  atomic.Pointer[error] // first error of a worker that stops the consumer

	// Owned by Run.
	kc      *kafka.Consumer
	commits *committer
	mu      sync.Mutex // guards parts for Stats
	parts   map[offsetstore.TP]*partition
	resyncs chan resyncRequest
	fatal   error
	eager   bool

	health    health        // what Readiness reports
	probeWake chan struct{} // wakes the topic probe
	beginSQL  string        // BEGIN with Config.Transaction's bounds
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

// perMessage runs h over a batch, naming the failing message and recovering its panic.
func perMessage(h Handler) BatchHandler {
	return func(ctx context.Context, tx pgx.Tx, msgs []*Message) error {
		for _, m := range msgs {
			if err := callOne(ctx, tx, h, m); err != nil {
				return &MessageError{Offset: m.Offset, Err: err}
			}
		}
		return nil
	}
}

func callOne(ctx context.Context, tx pgx.Tx, h Handler, m *Message) error {
	return handlercall.Call(func() error { return h(ctx, tx, m) })
}

func newConsumer(pool *pgxpool.Pool, handler BatchHandler, cfg *Config) (*Consumer, error) {
	if pool == nil {
		return nil, errors.New("kafkatx: nil *pgxpool.Pool")
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	prom, err := newPromHook(c.Registerer)
	if err != nil {
		return nil, fmt.Errorf("kafkatx: %w", err)
	}
	hooks, err := newHookSet([]Hook{prom}, c.Hooks)
	if err != nil {
		return nil, err
	}
	chained, err := Chain(handler, c.Middleware...)
	if err != nil {
		return nil, err
	}
	return &Consumer{
		pool:      pool,
		handler:   withGroup(chained, c.groupID()),
		cfg:       c,
		group:     c.groupID(),
		store:     offsetstore.New(c.Schema),
		log:       c.Logger.With(zap.String("group", c.groupID())),
		hooks:     hooks,
		metrics:   prom,
		parts:     map[offsetstore.TP]*partition{},
		probeWake: make(chan struct{}, 1),
		beginSQL:  c.Transaction.beginSQL(),
	}, nil
}

// begin opens a consumer transaction bounded by Config.Transaction: the one place the loop's
// transactions begin.
func (c *Consumer) begin(ctx context.Context) (pgx.Tx, error) {
	return c.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: c.beginSQL})
}

// Migrate applies kafkatx's embedded migrations to schema ("" means "kafkatx") under an
// advisory lock; it is safe to run from several processes at once and to run again.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	schema = pg.SchemaOr(schema)
	_, err := migrations.Apply(ctx, pool, schema)
	return err
}

// MigrationsMissingError is Run's error when Config.SkipMigrations is set and Schema lacks
// migrations this build of kafkatx needs.
type MigrationsMissingError struct {
	Schema  string
	Missing []int // versions not recorded in Schema.schema_migrations, in order
}

func (e *MigrationsMissingError) Error() string {
	return fmt.Sprintf("kafkatx: schema %q lacks migrations %v (Config.SkipMigrations is set): apply them with `kafkatx migrate up --schema %s` or Migrate",
		e.Schema, e.Missing, pgx.Identifier{e.Schema}.Sanitize())
}

// prepareSchema applies the migrations, or with Config.SkipMigrations checks them.
func (c *Consumer) prepareSchema(ctx context.Context) error {
	if !c.cfg.SkipMigrations {
		if err := Migrate(ctx, c.pool, c.cfg.Schema); err != nil {
			return fmt.Errorf("kafkatx: %w", err)
		}
		return nil
	}
	missing, err := migrations.Missing(ctx, c.pool, c.cfg.Schema)
	if err != nil {
		return fmt.Errorf("kafkatx: %w", err)
	}
	if len(missing) > 0 {
		return &MigrationsMissingError{Schema: c.cfg.Schema, Missing: missing}
	}
	return nil
}

// MigrationSQL returns the SQL that Migrate applies, for teams that run their own
// migration tool (goose, atlas, tern).
func MigrationSQL(schema string) string {
	schema = pg.SchemaOr(schema)
	return migrations.Script(schema)
}

// Stats returns a snapshot of the consumer's counters. Safe to call from any goroutine.
func (c *Consumer) Stats() Stats {
	s := Stats{
		Processed:       c.stats.processed.Load(),
		Duplicates:      c.stats.duplicates.Load(),
		Retries:         c.stats.retries.Load(),
		DeadLettered:    c.stats.deadLettered.Load(),
		SkippedOffsets:  c.stats.skipped.Load(),
		Pauses:          c.stats.pauses.Load(),
		NotChanges:      c.stats.notChanges.Load(),
		FirstAssignedAt: unixNanoTime(c.stats.firstAssigned.Load()),
		LastMessageAt:   unixNanoTime(c.stats.lastMessage.Load()),
		Unavailable:     c.stats.unavailable.Load(),
	}
	c.mu.Lock()
	s.Assigned = len(c.parts)
	for _, p := range c.parts {
		s.InFlight += p.inFlight()
		if p.heldBack.Load() {
			s.HeldBack++
		}
		if p.waiting.Load() != nil {
			s.Waiting++
		}
	}
	c.mu.Unlock()
	return s
}

// Run joins the consumer group and processes messages until ctx is cancelled or a fatal
// error occurs. In order, it:
//
//  1. applies kafkatx's embedded migrations to Config.Schema under an advisory lock (or,
//     with Config.SkipMigrations, only checks that they are applied);
//  2. creates the librdkafka consumer and subscribes to Config.Topics;
//  3. on each assignment reconciles the database watermark with Kafka's committed offset
//     (docs/offsets.md) and starts one worker per partition;
//  4. on cancellation stops polling, lets in-flight transactions finish within
//     Config.ShutdownTimeout (then aborts them), commits the final offsets and leaves the
//     group (a static member, with group.instance.id, stays until its session times out).
//
// It returns nil after a clean shutdown, or:
//   - *MigrationsMissingError: Config.SkipMigrations is set and the schema lacks versions;
//   - an error wrapping the migration, consumer-creation or subscription failure;
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
	if err := c.prepareSchema(ctx); err != nil {
		return err
	}
	km := c.cfg.Kafka
	var logs chan kafka.LogEvent
	if c.cfg.routeLogs {
		km = kafka.ConfigMap{}
		for k, v := range c.cfg.Kafka {
			km[k] = v
		}
		logs = make(chan kafka.LogEvent, 1000)
		km["go.logs.channel.enable"], km["go.logs.channel"] = true, logs
	}
	kc, err := kafka.NewConsumer(&km)
	if err != nil {
		return fmt.Errorf("kafkatx: create Kafka consumer: %w", err)
	}
	quitAux := make(chan struct{}) // stops the log router and the topic probe
	var aux sync.WaitGroup
	if logs != nil {
		aux.Add(1)
		go func() { defer aux.Done(); c.routeLogs(logs, quitAux) }()
	}
	stopAux := func() { close(quitAux); aux.Wait() }
	c.kc = kc
	c.resyncs = make(chan resyncRequest, 16)
	c.commits = newCommitter(kc, c.log)
	commitDone := make(chan struct{})
	go func() { defer close(commitDone); c.commits.run() }()

	err = kc.SubscribeTopics(c.cfg.Topics, func(_ *kafka.Consumer, ev kafka.Event) error {
		return c.rebalance(ctx, ev)
	})
	if err != nil {
		c.commits.stop()
		<-commitDone
		_ = closeWithin(kc, c.cfg.CloseTimeout)
		stopAux()
		return fmt.Errorf("kafkatx: subscribe %v: %w", c.cfg.Topics, err)
	}
	c.health.set(func(h *health) { h.running = true })
	probeQuit := make(chan struct{})
	probeDone := make(chan struct{})
	go func() { defer close(probeDone); c.probeTopics(probeQuit) }()
	c.log.Info("consumer started", zap.Strings("topics", c.cfg.Topics),
		zap.Int("batch_size", c.cfg.Batch.Size), zap.Int("max_attempts", c.cfg.Retry.MaxAttempts))

	lagTick := time.NewTicker(time.Second)
	defer lagTick.Stop()
	for ctx.Err() == nil && c.fatal == nil {
		if errp := c.failed.Load(); errp != nil {
			c.fatal = *errp
			break
		}
		pollMs := 50
		if c.servicePartitions() {
			pollMs = 1 // workers are being fed from memory: come back soon
		}
		select {
		case <-lagTick.C:
			c.updateLag()
			c.checkJoined() // KIP-848: a member with no partitions gets no callback
			c.passRecordless()
		default:
		}
		switch e := kc.Poll(pollMs).(type) {
		case *kafka.Message:
			c.dispatch(e)
		case kafka.Error:
			if err := c.onKafkaError(e); err != nil {
				c.fatal = err
			}
		}
	}
	if c.fatal != nil {
		c.health.set(func(h *health) {
			if h.fatal == nil {
				h.fatal = c.fatal
			}
		})
	}
	c.log.Info("consumer stopping", zap.NamedError("cause", c.fatal))
	// Stop every worker (in-flight transactions finish within the shutdown timeout), then
	// commit their final watermarks to Kafka before leaving the group.
	c.revokeAll(false)
	c.commits.stop()
	<-commitDone
	close(probeQuit)
	<-probeDone
	if err := closeWithin(kc, c.cfg.CloseTimeout); err != nil {
		c.log.Warn("close Kafka consumer", zap.Error(err))
	}
	stopAux()
	c.health.set(func(h *health) { h.running, h.joined = false, false })
	c.log.Info("consumer stopped")
	return c.fatal
}

// dispatch hands a polled message to its partition worker without blocking the poll loop.
// When the worker's queue is full the message is kept in memory. A partition holding more
// than its share of Config.MaxBufferedBytes is paused, and resumed once it holds half of it. Pausing is the exception, not the flow
// control of every batch: a resumed partition waits for a new fetch (measured here: about
// 0.4 s, which halved the drain rate when partitions paused every few batches). librdkafka
// resumes a paused partition at the offset after the last message it returned, so nothing
// is skipped (docs/design.md, "Pausing moves the fetch position").
func (c *Consumer) dispatch(m *kafka.Message) {
	tp := offsetstore.TP{Topic: *m.TopicPartition.Topic, Partition: m.TopicPartition.Partition}
	p := c.parts[tp]
	if p == nil || p.stopping() {
		return // not ours (any more); whoever owns it reads it from its watermark
	}
	off := int64(m.TopicPartition.Offset)
	hook("polled", off)
	c.stats.lastMessage.Store(time.Now().UnixNano())
	if off < p.dispatchedEnd.Load() {
		c.redeliveryDropped(tp, 1)
		return
	}
	p.dispatchedEnd.Store(off + 1)
	p.bytes.Add(messageBytes(m))
	if len(p.pending) == 0 {
		select {
		case p.in <- m:
			return
		default:
		}
	}
	p.pending = append(p.pending, m)
	p.pendingLen.Store(int64(len(p.pending)))
	if !p.paused && p.bytes.Load() > c.bufferShare() {
		if err := c.kc.Pause([]kafka.TopicPartition{p.ktp()}); err != nil {
			c.log.Warn("pause partition", zap.String("topic", tp.Topic), zap.Int32("partition", tp.Partition), zap.Error(err))
			return
		}
		p.paused = true
		c.partitionPaused(p)
	}
}

// messageBytes is what a held message counts against Config.MaxBufferedBytes: its key,
// value and headers plus a fixed 256 bytes for the structures around them.
func messageBytes(m *kafka.Message) int64 {
	n := int64(256 + len(m.Key) + len(m.Value))
	for _, h := range m.Headers {
		n += int64(len(h.Key) + len(h.Value))
	}
	return n
}

// bufferShare is each assigned partition's part of Config.MaxBufferedBytes, in bytes. A
// per-partition share keeps a partition whose worker is in a long backoff from pausing the
// others: only it stops fetching.
func (c *Consumer) bufferShare() int64 {
	return int64(c.cfg.MaxBufferedBytes) / int64(max(1, len(c.parts)))
}

// servicePartitions moves kept messages into worker queues, resumes paused partitions that
// hold half their share of Config.MaxBufferedBytes or less, and serves resync requests from
// fenced workers. It reports whether messages are still kept, so the poll loop comes
// back quickly to feed the workers.
func (c *Consumer) servicePartitions() (kept bool) {
	for {
		select {
		case r := <-c.resyncs:
			c.resync(r)
			continue
		default:
		}
		break
	}
	share := c.bufferShare()
	for _, p := range c.parts {
		n := 0
	feed:
		for n < len(p.pending) {
			select {
			case p.in <- p.pending[n]:
				p.pending[n] = nil
				n++
			default:
				break feed
			}
		}
		if n > 0 {
			p.pending = p.pending[n:]
			if len(p.pending) == 0 {
				p.pending = nil
			}
			p.pendingLen.Store(int64(len(p.pending)))
		}
		kept = kept || len(p.pending) > 0
		if p.paused && p.bytes.Load() <= share/2 {
			if err := c.kc.Resume([]kafka.TopicPartition{p.ktp()}); err != nil {
				c.log.Warn("resume partition", zap.String("topic", p.tp.Topic), zap.Int32("partition", p.tp.Partition), zap.Error(err))
				continue
			}
			p.paused = false
		}
	}
	return kept
}

type resyncRequest struct {
	p    *partition
	at   int64
	done chan struct{}
}

// resync drops everything kept in memory for a fenced partition and seeks it to the
// watermark the worker re-read from the database.
func (c *Consumer) resync(r resyncRequest) {
	defer close(r.done)
	p := r.p
	if c.parts[p.tp] != p {
		return
	}
	for _, m := range p.pending {
		p.bytes.Add(-messageBytes(m))
	}
	p.pending = nil
	p.pendingLen.Store(0)
	for len(p.in) > 0 {
		p.bytes.Add(-messageBytes(<-p.in))
	}
	p.dispatchedEnd.Store(r.at)
	tp := p.ktp()
	tp.Offset = kafka.Offset(r.at)
	if _, err := c.kc.SeekPartitions([]kafka.TopicPartition{tp}); err != nil {
		c.log.Warn("seek after fence", zap.String("topic", p.tp.Topic), zap.Int32("partition", p.tp.Partition), zap.Int64("offset", r.at), zap.Error(err))
	}
	if p.paused {
		if err := c.kc.Resume([]kafka.TopicPartition{p.ktp()}); err == nil {
			p.paused = false
		}
	}
}

func (c *Consumer) updateLag() {
	for tp, p := range c.parts {
		_, high, err := c.kc.GetWatermarkOffsets(tp.Topic, tp.Partition)
		if err != nil || high < 0 {
			continue
		}
		c.partitionLag(tp, p.watermark.Load(), high)
	}
}

// LogRangeError is returned by Run when a partition's database watermark is past the end of
// its log: the topic was deleted and recreated, or an unclean leader election truncated it.
// Nothing is processed: replay the new log with `kafkatx offsets reset --to-earliest --mode
// replay`, or skip to its end with `--to-latest --mode skip`.
type LogRangeError struct {
	Group            string
	Topic            string
	Partition        int32
	Watermark        int64 // the database's next offset to process
	LogStart, LogEnd int64 // the partition's log start and end offsets
}

func (e *LogRangeError) Error() string {
	return fmt.Sprintf("kafkatx: group %q %s[%d]: the database watermark %d is past the log end %d (log start %d): "+
		"the topic was recreated or its log truncated; nothing processed. With the consumer stopped, replay the log with "+
		"`kafkatx offsets reset --group %s --topic %s --partition %d --to-earliest --mode replay --reason TEXT --execute` "+
		"or skip to its end with `--to-latest --mode skip`",
		e.Group, e.Topic, e.Partition, e.Watermark, e.LogEnd, e.LogStart, shellWord(e.Group), shellWord(e.Topic), e.Partition)
}

// shellWord quotes s for a command suggested in an error: as is when plain, else in single
// quotes (group ids and topic names may hold characters a shell would act on).
func shellWord(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// fail stops the consumer with err (the first one wins); Run returns it.
func (c *Consumer) fail(err error) {
	err = fmt.Errorf("kafkatx: %w", err)
	c.failed.CompareAndSwap(nil, &err)
}

// OffsetAheadError is returned by Run under AheadHalt when Kafka's committed offset is
// ahead of the database watermark (a database restored from an older backup, or an offset
// moved with Kafka's own tools).
type OffsetAheadError struct {
	Group     string
	Topic     string
	Partition int32
	Watermark int64 // the database's next offset to process
	Committed int64 // Kafka's committed offset
}

func (e *OffsetAheadError) Error() string {
	return fmt.Sprintf("kafkatx: group %q %s[%d]: Kafka committed offset %d is ahead of the database watermark %d; policy is halt: "+
		"nothing processed. Align with `kafkatx offsets reset --to-database` or skip with `--mode skip`",
		e.Group, e.Topic, e.Partition, e.Committed, e.Watermark)
}
