package kafkatx

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/idempotency"
	"github.com/kafkatx/kafkatx/internal/engine"
	"github.com/kafkatx/kafkatx/limit"
	"github.com/kafkatx/kafkatx/pg"
	"github.com/kafkatx/kafkatx/shards"
)

// AheadPolicy says what the consumer does when Kafka's committed offset K is ahead of the
// database watermark W on assignment (docs/design.md, "Offsets: the database leads, Kafka follows").
type AheadPolicy int

const (
	// AheadFollow starts at K and records [W, K) in the offset audit: as an operator skip
	// when a kafkatx command recorded the move, otherwise as an unexplained skip, logged at
	// error level and counted. The default.
	AheadFollow AheadPolicy = iota
	// AheadHalt stops the consumer with an *OffsetAheadError naming both offsets and
	// processes nothing on that partition.
	AheadHalt
)

// LogChangePolicy says what the consumer does when the log behind a watermark is another one
// on assignment: the topic's id (KIP-516) or the cluster's id differs from the one recorded
// with the watermark — the topic was deleted and created again under the same name, or the
// brokers are another cluster (docs/offsets.md, "Which log a watermark is in").
type LogChangePolicy int

const (
	// LogChangeHalt stops the consumer with a *LogChangedError naming both ids before it
	// applies anything from the new log; an operator adopts it with `kafkatx offsets reset
	// --mode adopt`. The default.
	LogChangeHalt LogChangePolicy = iota
	// LogChangeAdoptEarliest adopts the new log from its log start: every record it holds is
	// processed. Audited as log_adopted with both ids; logged at warn level.
	LogChangeAdoptEarliest
	// LogChangeAdoptLatest adopts the new log from its log end: the records it holds now are
	// skipped, on record (log_adopted).
	LogChangeAdoptLatest
)

func (p LogChangePolicy) String() string {
	switch p {
	case LogChangeAdoptEarliest:
		return "adopt-earliest"
	case LogChangeAdoptLatest:
		return "adopt-latest"
	}
	return "halt"
}

// ParseLogChangePolicy reads "halt", "adopt-earliest" or "adopt-latest" (the examples'
// --on-log-change).
func ParseLogChangePolicy(s string) (LogChangePolicy, error) {
	for _, p := range []LogChangePolicy{LogChangeHalt, LogChangeAdoptEarliest, LogChangeAdoptLatest} {
		if s == p.String() {
			return p, nil
		}
	}
	return LogChangeHalt, fmt.Errorf("%q: want halt, adopt-earliest or adopt-latest", s)
}

// adoptNewLog is p as engine.Settings.AdoptNewLog.
func (p LogChangePolicy) adoptNewLog() string {
	switch p {
	case LogChangeAdoptEarliest:
		return "earliest"
	case LogChangeAdoptLatest:
		return "latest"
	}
	return ""
}

func (p AheadPolicy) String() string {
	if p == AheadHalt {
		return "halt"
	}
	return "follow"
}

// Config configures a Consumer. The zero value of every field means its default; a nil
// *Config is not accepted because Kafka and Topics are required.
type Config struct {
	// Kafka is passed to librdkafka as is (bootstrap.servers and group.id are required;
	// group.id is at most MaxGroupIDBytes; security settings such as sasl.* and ssl.* pass
	// through). kafkatx sets
	// enable.auto.commit=false and enable.auto.offset.store=false and refuses either set to
	// true. Unless set here: group.protocol=classic, partition.assignment.strategy=
	// cooperative-sticky (classic only), auto.offset.reset=earliest, isolation.level=
	// read_committed (records of aborted transactions are never handed to the handler;
	// read_uncommitted passes them on, as for any consumer). group.protocol=consumer
	// (KIP-848, a preview in librdkafka 2.11: docs/consumer.md, "The consumer group protocol")
	// is an opt-in: the broker then assigns partitions (group.remote.assignor passes through)
	// and owns the session and heartbeat timing, so with it partition.assignment.strategy,
	// session.timeout.ms, heartbeat.interval.ms and group.protocol.type are refused, naming the
	// broker setting to use instead. group.instance.id (KIP-345 static
	// membership) passes through. librdkafka's log lines are written to Logger (named
	// "kafkatx.consumer.librdkafka", with their facility and syslog level) unless
	// go.logs.channel.enable is set here.
	Kafka kafka.ConfigMap

	// Topics to subscribe to. Required.
	Topics []string

	// Schema holds kafkatx's tables. Defaults to "kafkatx".
	Schema string

	// SkipMigrations makes Run use Schema as it is instead of applying kafkatx's embedded
	// migrations first: for a database role that may not create or alter tables (least
	// privilege), with migrations applied by `kafkatx migrate up`, by Migrate, or by your own
	// tool from MigrationSQL. Run then checks that every migration of this build is applied
	// and returns a *MigrationsMissingError naming the missing versions otherwise. Defaults
	// to false: Run migrates.
	SkipMigrations bool

	// Shards, when set, keeps each partition's state on, and runs its handler's transactions
	// on, the shard the directory maps it to (package shards; docs/deployment.md, "When to
	// shard, and how"): the pool given to NewConsumer is then only the directory's database's
	// home pool, and Shards.Directory is read at every assignment. Run migrates (or, with
	// SkipMigrations, checks) Schema on the directory and on every shard, and watches that
	// each shard's outbox has a relay (ShardUnrelayedAfter; the gauge
	// kafkatx_shard_relay_unowned and the readiness note "shard relays"). Nil (the default):
	// one database, as before.
	Shards *shards.Set

	// Logger receives the consumer's logs, named "kafkatx.consumer". Message values are
	// never logged. Defaults to zap.NewNop().
	Logger *zap.Logger

	// Retry decides how often and how fast a failing message is retried.
	Retry RetryPolicy

	// Batch bounds how many messages of one partition share a transaction.
	Batch BatchConfig

	// ShutdownTimeout bounds how long in-flight transactions may run once Run's context is
	// cancelled or a partition is revoked; after it their context is cancelled and they
	// roll back. Defaults to 30s.
	ShutdownTimeout time.Duration

	// Transaction bounds every database transaction the consumer opens, the handler's
	// included, so that a frozen or partitioned process cannot hold its row locks and stall
	// the partitions' new owners.
	Transaction TransactionConfig

	// CloseTimeout bounds how long Run waits for the Kafka client to close (leave the group,
	// destroy the handle) once its workers stopped. librdkafka's close can wait forever after a
	// fatal error (a fenced static member); past the timeout Run returns anyway and the client
	// is left to the process's exit. It also bounds the synchronous offset commits: a
	// revocation's or the shutdown's final commit waits at most half of it for Kafka's answer
	// (a frozen broker may never give one), then goes on without it — the database watermark
	// leads (docs/consumer.md, "A frozen broker"). Defaults to 10s.
	CloseTimeout time.Duration

	// OnKafkaAhead is the policy when Kafka's committed offset is ahead of the database
	// watermark on assignment. Defaults to AheadFollow.
	OnKafkaAhead AheadPolicy

	// OnLogChange is the policy when the log behind a watermark is another one on assignment
	// (the topic recreated, another cluster). Defaults to LogChangeHalt.
	OnLogChange LogChangePolicy

	// DeadLetter configures the publication of dead letters to a dead-letter topic
	// through the outbox (in the same transaction as the dead-letter row).
	DeadLetter DeadLetterConfig

	// Idempotency configures business idempotency keys: a message whose key was already
	// claimed in the group's current replay epoch is skipped.
	Idempotency IdempotencyConfig

	// MaxValueBytes dead-letters a message whose value is larger, in bytes, without
	// running the handler (error class "oversized"). Defaults to 0: no limit beyond
	// librdkafka's fetch limits and the broker's message.max.bytes.
	MaxValueBytes int

	// MaxBufferedBytes bounds the messages the consumer holds in memory beyond librdkafka's
	// own queue (queued.max.messages.kbytes), counting keys, values, headers and 256 bytes
	// per message. Each assigned partition gets an equal share: a partition holding more is
	// paused (it stops fetching, the others go on) until it holds half its share. Raise it
	// for consumers with many partitions each. Defaults to 32 MiB.
	MaxBufferedBytes int

	// UnavailableMaxWait is how long a partition waits, for one message, for a dependency its
	// handler reported Unavailable before further Unavailable answers count as ordinary
	// failures (attempts). Defaults to UnavailableMaxWaitDefault (30 minutes). An answer
	// naming a target that does not exist yet — an error in its chain with a method
	// WaitUnbounded() bool returning true, as idempotency/airflow's for a DAG or an asset
	// Airflow does not know (404) — is waited out without this bound and never becomes an
	// attempt (engine.WaitsUnbounded).
	UnavailableMaxWait time.Duration

	// StallAfter is the watchdog's bound: a partition this member holds, with lag (its log
	// end past its watermark), whose watermark has not moved for StallAfter is reported
	// whatever the cause — logged at error level once, kafkatx_partition_stalled 1,
	// Readiness.Stalled and not ready — until it moves; its fetch is also resumed in the Kafka
	// client unless the loop holds it (docs/consumer.md, "Liveness"). A partition waiting out
	// a long backoff, an Unavailable dependency or a Backpressure hold is reported too, since
	// it makes no progress either. Defaults to StallAfterDefault (2 minutes); negative: off.
	StallAfter time.Duration

	// Breaker stops a storm of dead letters when failures are shared — a revoked privilege,
	// a column a deploy renamed, a dependency that fails for everyone — rather than one
	// message's (docs/failures.md, "The breaker").
	Breaker BreakerConfig

	// Concurrency is the most units (transactions) of one partition in flight at once, never
	// two of one record key: a partition's messages run in Concurrency fixed lanes (lane =
	// FNV-1a of the key mod Concurrency; records without a key are spread by offset and have
	// no order among themselves), each lane in offset order, so one key's messages are applied
	// in offset order and a message in retry or backoff holds only its lane. Each unit is its
	// own transaction with everything a batch has (effects, idempotency claims, attempts, dead
	// letters, outbox records); a BatchHandler gets batches of one lane's messages. Units
	// commit out of offset order: each records its offsets in done_offsets, the watermark and
	// Kafka's committed offset are the lowest offset not yet done, and after a crash the done
	// offsets are skipped, so nothing is applied twice; Concurrency may change between runs
	// (docs/design.md, "Per-key concurrency"). Defaults to 1: one unit at a time, in offset
	// order, exactly as without it.
	Concurrency int

	// Park parks a key in trouble in PostgreSQL so that the partition's other keys go on
	// (docs/design.md, "Parked keys"). Off by default: parking lets other keys of a partition
	// overtake a parked one, which a consumer relying on a partition's order across keys
	// (related rows of one table, foreign keys between them) must not be given unasked.
	Park ParkConfig

	// MaxUnits caps the units in flight over the whole consumer (all partitions); a unit
	// waits for a free slot. Defaults to MaxUnitsDefault (256).
	MaxUnits int

	// Prepare, when set, runs on a unit's messages before its transaction begins, outside any
	// transaction and without a pooled connection: for a slow call to another service (an
	// HTTP API, an orchestrator) whose answer the handler then records in the transaction
	// (Message.SetContext carries it to the handler). It must be idempotent: it runs again
	// when the transaction fails or rolls back, or after a crash before the commit. Its errors
	// follow the handler's rules (FailMessage, Permanent, Unavailable, a panic, a retryable
	// PostgreSQL error). Defaults to nil.
	Prepare func(ctx context.Context, msgs []*Message) error

	// PrepareLimit bounds the Prepare calls in flight over the whole consumer (every
	// partition and lane): a unit waits for a permit, outside any transaction, before its
	// Prepare runs, and the call's latency and answer feed the limit (package limit: it adapts
	// — a call answered Unavailable, or a retryable database error, counts as dropped and
	// shrinks it, except an Unavailable for a record key already answered so with no success
	// since: one key's refusals are its own, not the far side's (package limit); a success is
	// a latency sample; a handler-style failure says nothing of the far side's speed). With Concurrency lanes in each of P partitions, Concurrency × P
	// calls could otherwise reach the far side at once, bounded by nothing that knows it.
	// Defaults to limit.New(limit.Config{}) when Prepare is set (4 at the start, 1 to 256);
	// limit.Fixed(MaxUnits) adds no bound of its own (a client that limits its own calls, as
	// idempotency/airflow does).
	PrepareLimit *limit.Limiter

	// Backpressure, when set, is called by each partition's worker before a batch's
	// transaction begins, outside any transaction, and may block to hold the partition back:
	// outbox.Writer.WaitBelow returns one that waits while the outbox holds too many rows, so
	// a consumer does not outrun its relay without bound. ctx ends when the partition stops
	// (revoked, or the consumer shuts down), and it should return then; one that ignores ctx
	// is left behind (its goroutine goes on) once the partition's work is aborted, after
	// ShutdownTimeout or when the partition is lost. An error or a panic (logged with its
	// stack) means the check cannot answer: the batch waits and the check runs again after
	// the Unavailable backoff (capped at UnavailableMaxBackoff, 10 s), Readiness reports it
	// (BackpressureFailing, not ready), for at most UnavailableMaxWait since its first
	// failure; then the batch runs, and each later one after one call, until it answers: a
	// broken throttle is bounded and never stalls the loop. While it blocks, the partition's messages stay buffered
	// and count as in flight, Stats.HeldBack counts the partition, a hold over 10 s is logged
	// at info level, and past its MaxBufferedBytes share the partition stops fetching.
	// Defaults to nil: no wait.
	Backpressure func(ctx context.Context) error

	// Registerer receives the consumer's Prometheus metrics (docs/consumer.md lists them).
	// Defaults to none (the counters are still kept and readable with Stats).
	Registerer prometheus.Registerer

	// Middleware wraps the handler, in order: Middleware[0] is the outermost, it runs first
	// and sees what the others and the handler returned. A middleware's error or panic is the
	// handler's (see Middleware). Defaults to none.
	Middleware []Middleware

	// Hooks receive the loop's events (batch committed, retry scheduled, dead-lettered,
	// fenced, partitions assigned and revoked, offsets skipped, ...): each a value that
	// implements one or more of the Hook* interfaces (see Hook). They are called after
	// kafkatx's own Prometheus hook, in order. NewConsumer refuses one that implements none.
	// Defaults to none.
	Hooks []Hook
}

// RetryPolicy is the blocking retry policy for handler failures. Attempts are counted
// durably; a retry pauses only the message's partition.
type RetryPolicy struct {
	// MaxAttempts is the number of tries, crashes included, after which a message is
	// dead-lettered. Defaults to MaxAttemptsDefault (5).
	MaxAttempts int
	// InitialBackoff is the wait before the second try. Defaults to 200ms.
	InitialBackoff time.Duration
	// MaxBackoff caps the wait between tries. Defaults to 30s.
	MaxBackoff time.Duration
	// Multiplier grows the wait after each try. Defaults to 2.
	Multiplier float64
	// Jitter is the randomization factor in [0, 1): each wait is drawn uniformly from
	// [d·(1−Jitter), d·(1+Jitter)]. Defaults to 0.2.
	Jitter float64
}

// Backoff returns the wait before try number attempt+1 after attempt failed tries
// (attempt ≥ 1): InitialBackoff·Multiplier^(attempt−1), capped at MaxBackoff, with jitter
// (github.com/cenkalti/backoff/v5).
func (p RetryPolicy) Backoff(attempt int) time.Duration {
	b := &backoff.ExponentialBackOff{
		InitialInterval:     p.InitialBackoff,
		RandomizationFactor: p.Jitter,
		Multiplier:          p.Multiplier,
		MaxInterval:         p.MaxBackoff,
	}
	b.Reset()
	d := b.NextBackOff()
	for i := 1; i < attempt && d < p.MaxBackoff; i++ {
		d = b.NextBackOff()
	}
	return d
}

// BatchConfig bounds the per-partition transactions. A batch is run optimistically in one
// transaction; if a message in it fails, the batch is rolled back and its messages are re-run
// so that only the failing message is retried or dead-lettered.
type BatchConfig struct {
	// Size is the most messages per transaction. Defaults to 500. 1 gives one transaction
	// per message.
	Size int
	// Wait is how long a partition worker waits for more messages to fill a batch once it
	// holds one. Defaults to 0: take what has arrived and go.
	Wait time.Duration
}

// TransactionConfig sets PostgreSQL's per-transaction timeouts (SET LOCAL, one round trip
// with BEGIN) on every transaction the consumer opens. A timeout that ends a transaction —
// lock_timeout (SQLSTATE 55P03), the session ended by idle_in_transaction_session_timeout
// (25P03) — is retried with backoff and is not an attempt; a statement_timeout (57014) in the
// handler is the handler's failure and counts as one. A handler that calls out (an HTTP API,
// an orchestrator) keeps each call's own timeout well under IdleTimeout and does any long
// wait outside the transaction. One rule for every field: zero is the default, a negative
// value is off — the server's setting is left alone, and the handler-stuck report
// (Settings.StuckAfter), which is derived from IdleTimeout and StatementTimeout, is off too.
type TransactionConfig struct {
	// IdleTimeout is idle_in_transaction_session_timeout: a transaction idle for longer (its
	// process frozen, stopped by SIGSTOP or cut off by a network partition) has its session
	// ended by the server, which releases its row locks; its late commit then fails and the
	// watermark stays fenced. Defaults to 10s.
	IdleTimeout time.Duration
	// LockTimeout is lock_timeout: the longest one statement waits for a row or table lock.
	// Defaults to 10s.
	LockTimeout time.Duration
	// StatementTimeout is statement_timeout: the longest one statement runs. Defaults to 60s.
	StatementTimeout time.Duration
}

// beginSQL is the BEGIN of a consumer transaction with the bounds of t (defaults applied),
// sent as one simple-protocol query.
func (t TransactionConfig) beginSQL() string {
	q := "BEGIN"
	for _, s := range []struct {
		name string
		d    time.Duration
	}{{"idle_in_transaction_session_timeout", t.IdleTimeout}, {"lock_timeout", t.LockTimeout}, {"statement_timeout", t.StatementTimeout}} {
		if s.d >= 0 {
			q += fmt.Sprintf("; SET LOCAL %s = %d", s.name, max(s.d.Milliseconds(), 1))
		}
	}
	return q
}

// DeadLetterConfig configures publishing dead letters to Kafka through the outbox.
type DeadLetterConfig struct {
	// Disabled keeps dead letters in the database only.
	Disabled bool
	// Topic maps a source topic to its dead-letter topic. Defaults to topic + ".dlq". A panic
	// of Topic is recovered: the dead letter is not written, the error is logged and the
	// dead-letter transaction tried again, so the partition waits for a fixed configuration.
	Topic func(topic string) string
}

// IdempotencyConfig configures business idempotency keys (docs/design.md, "Terms"). The key is
// claimed in the message's transaction (table idempotency_keys, scope "<group>/<replay
// epoch>"); a message whose key is already claimed is skipped — its handler does not run, its
// offset is passed — and counted as a duplicate. An operator replay opens a new epoch, so a
// replay runs handlers again.
type IdempotencyConfig struct {
	// Key derives the key. Defaults to idempotency.FromOutboxID(): records published by a
	// kafkatx relay carry the kafkatx-outbox-id header, so a relay's re-publish of a record has
	// no effect; records without the header are keyed by their offset alone. A key function
	// error dead-letters the message (error class "permanent"), except one wrapping
	// idempotency.ErrNotAChange (FromDebezium's answer for tombstones, heartbeats and
	// transaction metadata): the handler does not run for that message, it is committed past
	// and counted in Stats.NotChanges. A panic of Key is recovered and treated as a handler
	// panic (class "panic", its stack kept): an attempt, retried, dead-lettered after
	// Retry.MaxAttempts — not at once, since a panic may come from state other than the
	// message's bytes.
	Key idempotency.KeyFunc
	// Disabled turns business keys off; the watermark still makes each offset effective once.
	Disabled bool
	// Retention is how long a claimed key is remembered; pg.KeepForever (any negative
	// duration) keeps keys forever. Defaults to 7 days (idempotency.DefaultRetention).
	Retention time.Duration
}

// reservedKafkaKeys are set by kafkatx; the user may not turn them on.
var refusedTrue = []string{"enable.auto.commit", "enable.auto.offset.store"}

// consumerProtocolRefused are the librdkafka settings of the classic group protocol that
// librdkafka refuses under group.protocol=consumer (KIP-848), with what to do instead.
var consumerProtocolRefused = []struct{ key, instead string }{
	{"partition.assignment.strategy", "the broker assigns partitions; choose its assignor with group.remote.assignor (uniform or range)"},
	{"session.timeout.ms", "the session timeout is the broker's group.consumer.session.timeout.ms (default 45 s), or the group's config of that name"},
	{"heartbeat.interval.ms", "the heartbeat interval is the broker's group.consumer.heartbeat.interval.ms (default 5 s), or the group's config of that name"},
	{"group.protocol.type", "it belongs to the classic protocol"},
}

// MaxGroupIDBytes is the longest consumer group id (Config.Kafka's group.id) NewConsumer
// accepts, in bytes. The group id is part of the primary or unique key of kafkatx's
// watermarks, attempts, dead letters, done offsets and console samples, and of the
// idempotency scope "<group>/<replay epoch>" (idempotency.MaxScopeBytes), all of which must
// stay within PostgreSQL's B-tree entry limit (about 2,700 bytes); Kafka itself sets none.
const MaxGroupIDBytes = 500

// validate checks what NewConsumer cannot default: c itself, Topics, the required Kafka
// settings, and the librdkafka settings kafkatx refuses.
func (c *Config) validate() error {
	if c == nil {
		return errors.New("kafkatx: nil *Config: Kafka (bootstrap.servers, group.id) and Topics are required")
	}
	if len(c.Topics) == 0 {
		return errors.New("kafkatx: Config.Topics is empty")
	}
	if err := c.validateBounds(); err != nil {
		return err
	}
	if c.Shards != nil {
		if err := c.Shards.Validate(); err != nil {
			return fmt.Errorf("kafkatx: Config.Shards: %w", err)
		}
	}
	for _, k := range []string{"bootstrap.servers", "group.id"} {
		if v, ok := c.Kafka[k]; !ok || fmt.Sprint(v) == "" {
			return fmt.Errorf("kafkatx: Config.Kafka needs %q", k)
		}
	}
	if n := len(fmt.Sprint(c.Kafka["group.id"])); n > MaxGroupIDBytes {
		return fmt.Errorf("kafkatx: Config.Kafka group.id is %d bytes, more than MaxGroupIDBytes (%d)", n, MaxGroupIDBytes)
	}
	for _, k := range refusedTrue {
		if v, ok := c.Kafka[k]; ok && strings.EqualFold(fmt.Sprint(v), "true") {
			return fmt.Errorf("kafkatx: Config.Kafka %s=true is refused: kafkatx commits offsets itself, after the database transaction", k)
		}
	}
	switch proto := strings.ToLower(fmt.Sprint(c.Kafka["group.protocol"])); proto {
	case "classic", "<nil>":
	case "consumer":
		for _, r := range consumerProtocolRefused {
			if _, ok := c.Kafka[r.key]; ok {
				return fmt.Errorf("kafkatx: Config.Kafka %s is refused with group.protocol=consumer (KIP-848): %s", r.key, r.instead)
			}
		}
	default:
		return fmt.Errorf("kafkatx: Config.Kafka group.protocol=%q: want classic (the default) or consumer (KIP-848)", proto)
	}
	return nil
}

// Defaults of Config's fields: the value a zero field takes.
const (
	MaxAttemptsDefault        = 5                      // RetryPolicy.MaxAttempts
	InitialBackoffDefault     = 200 * time.Millisecond // RetryPolicy.InitialBackoff
	MaxBackoffDefault         = 30 * time.Second       // RetryPolicy.MaxBackoff
	MultiplierDefault         = 2.0                    // RetryPolicy.Multiplier
	JitterDefault             = 0.2                    // RetryPolicy.Jitter
	BatchSizeDefault          = 500                    // BatchConfig.Size
	MaxBufferedBytesDefault   = 32 << 20               // Config.MaxBufferedBytes, in bytes
	UnavailableMaxWaitDefault = 30 * time.Minute       // Config.UnavailableMaxWait
	ShutdownTimeoutDefault    = 30 * time.Second       // Config.ShutdownTimeout
	CloseTimeoutDefault       = 10 * time.Second       // Config.CloseTimeout
	StallAfterDefault         = 2 * time.Minute        // Config.StallAfter
	IdleTimeoutDefault        = 10 * time.Second       // TransactionConfig.IdleTimeout
	LockTimeoutDefault        = 10 * time.Second       // TransactionConfig.LockTimeout
	StatementTimeoutDefault   = 60 * time.Second       // TransactionConfig.StatementTimeout
	DeadLetterSuffixDefault   = ".dlq"                 // DeadLetterConfig.Topic: the source topic + this suffix
	BreakerThresholdDefault   = 3                      // BreakerConfig.Threshold, in messages
	BreakerProbeDefault       = 5 * time.Second        // BreakerConfig.Probe
	ConcurrencyDefault        = 1                      // Config.Concurrency
	MaxUnitsDefault           = 256                    // Config.MaxUnits
	ParkMaxPerKeyDefault      = 10_000                 // ParkConfig.MaxPerKey, in messages
	ParkMaxKeysDefault        = 10_000                 // ParkConfig.MaxKeys, in keys per partition
)

// ParkConfig configures parked keys (Config.Park). With Enabled, a message whose handling is
// to be retried — it failed with attempts left, or its dependency answered Unavailable for it
// — parks its key, with any Concurrency (1 included): the message is written to the
// key_parking table in a transaction that also records its offset done (fenced on the
// watermark), the watermark moves past it, and every later message of the key is parked behind
// it without running until the key's parked messages are done. The consumer retries each
// parked key's first message at its next try (Retry's backoff; an Unavailable answer spends no
// attempt, until UnavailableMaxWait since its first failure), dead-letters it after
// Retry.MaxAttempts, and then runs the key's next parked message: a key's messages are applied
// in offset order, other keys overtake it. A failure shared by many keys never parks them
// all: a PostgreSQL error of the handler or the database's own condition never parks, and
// failures that park count in the breaker (Breaker) — once it opens, the partition waits as
// without parking. Parked messages count as in flight (Stats.InFlight), so a parked key keeps a
// consumer from being idle.
type ParkConfig struct {
	// Enabled turns parking on. Default false.
	Enabled bool
	// MaxPerKey bounds one key's parked messages. At the bound the key's next message is not
	// parked: it waits in its lane (at Concurrency 1 the partition waits) until the key's
	// first message is done, logged as "blocked by key K at offset X" and reported by the
	// stall watchdog — the key is held rather than its first message dead-lettered early,
	// which would punish it for the number of messages behind it. Defaults to
	// ParkMaxPerKeyDefault (10,000); negative: no bound.
	MaxPerKey int
	// MaxKeys bounds a partition's parked keys. At the bound a failing message of a key not
	// yet parked is retried in place as without parking (holding its lane, at Concurrency 1
	// its partition), logged as "blocked by key K at offset X" and reported by the stall
	// watchdog: many keys failing at once is a shared failure more than a key's. Defaults to
	// ParkMaxKeysDefault (10,000); negative: no bound.
	MaxKeys int
}

// BreakerConfig configures the breaker: when Threshold distinct messages — of any partitions
// of the consumer — fail alike (the same SQLSTATE for a PostgreSQL error, otherwise the same
// error text with its digits blanked; kafkatx.Permanent failures are not counted) with no
// transaction succeeding in between, the breaker opens: each partition whose try fails alike
// rolls it back without recording an attempt or a dead letter and waits Probe outside any
// transaction before trying again; the first transaction that commits handled messages
// closes it. It is logged once when it opens and when it closes, makes Readiness not ready
// (Readiness.Breaker, the SQLSTATE named) and sets the kafkatx_breaker_open gauge. Bounded as
// Unavailable's wait is: open longer than Config.UnavailableMaxWait, it holds no more and
// tries count as attempts again. One bad message among good ones never opens it: the good
// ones' commits reset the count.
type BreakerConfig struct {
	// Threshold is the number of distinct messages failing alike that opens the breaker.
	// Defaults to BreakerThresholdDefault (3); negative: no breaker.
	Threshold int
	// Probe is how long a held partition waits between tries. Defaults to
	// BreakerProbeDefault (5 s).
	Probe time.Duration
}

// UnavailableMaxBackoff caps the wait between two tries of a message whose handler returned
// Unavailable.
const UnavailableMaxBackoff = 10 * time.Second

// Deprecated names of defaults, kept for callers of earlier versions.
const (
	DefaultMaxAttempts        = MaxAttemptsDefault        // Deprecated: use MaxAttemptsDefault.
	DefaultUnavailableMaxWait = UnavailableMaxWaitDefault // Deprecated: use UnavailableMaxWaitDefault.
)

// WithDefaults returns a copy of c with every zero field set to the default the consumer runs
// with (the *Default constants above; Idempotency.Key idempotency.FromOutboxID, Retention
// idempotency.DefaultRetention, DeadLetter.Topic the source topic + DeadLetterSuffixDefault),
// the one place the loop's defaults are applied: NewConsumer runs with it and the test kit
// kafkatxtest reads its rules from it (River's Config.WithDefaults). It validates nothing
// (NewConsumer does); the user's Config and its Kafka map are not changed.
func (c *Config) WithDefaults() Config {
	out := *c
	out.Schema = pg.SchemaOr(out.Schema)
	if out.Logger == nil {
		out.Logger = zap.NewNop()
	}
	r := &out.Retry
	if r.MaxAttempts <= 0 {
		r.MaxAttempts = MaxAttemptsDefault
	}
	if r.InitialBackoff <= 0 {
		r.InitialBackoff = InitialBackoffDefault
	}
	if r.MaxBackoff <= 0 {
		r.MaxBackoff = MaxBackoffDefault
	}
	if r.Multiplier < 1 {
		r.Multiplier = MultiplierDefault
	}
	if r.Jitter <= 0 || r.Jitter >= 1 {
		r.Jitter = JitterDefault
	}
	if out.MaxBufferedBytes <= 0 {
		out.MaxBufferedBytes = MaxBufferedBytesDefault
	}
	if out.UnavailableMaxWait <= 0 {
		out.UnavailableMaxWait = UnavailableMaxWaitDefault
	}
	if out.Breaker.Threshold == 0 {
		out.Breaker.Threshold = BreakerThresholdDefault
	}
	if out.Breaker.Probe <= 0 {
		out.Breaker.Probe = BreakerProbeDefault
	}
	if out.Batch.Size <= 0 {
		out.Batch.Size = BatchSizeDefault
	}
	if out.Concurrency <= 0 {
		out.Concurrency = ConcurrencyDefault
	}
	if out.MaxUnits <= 0 {
		out.MaxUnits = MaxUnitsDefault
	}
	if out.Park.MaxPerKey == 0 {
		out.Park.MaxPerKey = ParkMaxPerKeyDefault
	}
	if out.Park.MaxKeys == 0 {
		out.Park.MaxKeys = ParkMaxKeysDefault
	}
	if out.Prepare != nil && out.PrepareLimit == nil {
		out.PrepareLimit = limit.MustNew(limit.Config{})
	}
	if out.ShutdownTimeout <= 0 {
		out.ShutdownTimeout = ShutdownTimeoutDefault
	}
	if out.CloseTimeout <= 0 {
		out.CloseTimeout = CloseTimeoutDefault
	}
	if out.StallAfter == 0 {
		out.StallAfter = StallAfterDefault
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&out.Transaction.IdleTimeout, IdleTimeoutDefault}, {&out.Transaction.LockTimeout, LockTimeoutDefault}, {&out.Transaction.StatementTimeout, StatementTimeoutDefault}} {
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if out.Idempotency.Key == nil {
		out.Idempotency.Key = idempotency.FromOutboxID()
	}
	if out.Idempotency.Retention == 0 {
		out.Idempotency.Retention = idempotency.DefaultRetention
	}
	if out.DeadLetter.Topic == nil {
		out.DeadLetter.Topic = func(t string) string { return t + DeadLetterSuffixDefault }
	}
	return out
}

// settings validates c and returns what the engine runs: c with its defaults, and the
// librdkafka configuration as kafkatx runs it — auto commits off; auto.offset.reset=earliest
// (the user's value applies to partitions never run, through StartAtEnd); the group
// protocol's defaults; isolation.level=read_committed and queued.max.messages.kbytes=16384
// unless set; librdkafka's logs routed to Logger unless go.logs.channel.enable is set.
func (c *Config) settings() (*engine.Settings, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	d := c.WithDefaults()
	km := kafka.ConfigMap{}
	for k, v := range c.Kafka {
		km[k] = v
	}
	for _, k := range refusedTrue {
		km[k] = false
	}
	setDefault := func(k string, v kafka.ConfigValue) {
		if _, ok := km[k]; !ok {
			km[k] = v
		}
	}
	setDefault("group.protocol", "classic")
	proto := strings.ToLower(fmt.Sprint(km["group.protocol"]))
	km["group.protocol"] = proto
	if proto == "classic" {
		setDefault("partition.assignment.strategy", "cooperative-sticky")
	}
	// kafkatx resolves the user's auto.offset.reset itself for partitions seen for the first
	// time; librdkafka's own reset (a fetch out of range: retention passed the watermark)
	// always goes to the earliest offset, so the gap it leaves is exactly the records that
	// retention removed, which the loop then audits.
	startAt := "earliest"
	if v, ok := km["auto.offset.reset"]; ok {
		startAt = fmt.Sprint(v)
	}
	km["auto.offset.reset"] = "earliest"
	// librdkafka's own default too, set so that it is kafkatx's decision: an exactly-once
	// style loop must not apply what a transactional producer aborted.
	setDefault("isolation.level", "read_committed")
	// Bound librdkafka's pre-fetch queue (librdkafka defaults: 64 MiB, 100,000 messages per
	// partition set), so a large backlog does not grow the process without bound.
	setDefault("queued.max.messages.kbytes", 16384)
	_, logsSet := km["go.logs.channel.enable"]
	unavail := d.Retry
	unavail.MaxBackoff = UnavailableMaxBackoff
	var dlqTopic func(string) string
	if !d.DeadLetter.Disabled {
		dlqTopic = d.DeadLetter.Topic
	}
	return &engine.Settings{
		Group: fmt.Sprint(km["group.id"]), Topics: d.Topics, Kafka: km, RouteLogs: !logsSet,
		StartAtEnd: startAt == "latest" || startAt == "largest" || startAt == "end", ConsumerProtocol: proto == "consumer",
		Schema: d.Schema, Logger: d.Logger.Named("kafkatx.consumer"), Placer: placerOf(d.Shards, d.Schema),
		BeginSQL: d.Transaction.beginSQL(), IdleTimeout: d.Transaction.IdleTimeout,
		BatchSize: d.Batch.Size, BatchWait: d.Batch.Wait, Concurrency: d.Concurrency, MaxUnits: d.MaxUnits,
		ParkKeys: d.Park.Enabled, ParkMaxPerKey: d.Park.MaxPerKey, ParkMaxKeys: d.Park.MaxKeys,
		MaxAttempts: d.Retry.MaxAttempts, Backoff: d.Retry.Backoff, UnavailableBackoff: unavail.Backoff,
		UnavailableMaxWait: d.UnavailableMaxWait, BreakerThreshold: d.Breaker.Threshold, BreakerProbe: d.Breaker.Probe,
		StuckAfter: stuckAfter(d.Transaction), StallAfter: d.StallAfter, ShutdownTimeout: d.ShutdownTimeout, CloseTimeout: d.CloseTimeout,
		MaxValueBytes: d.MaxValueBytes, MaxBufferedBytes: d.MaxBufferedBytes, Backpressure: d.Backpressure,
		DeadLetterTopic: dlqTopic, HaltOnAhead: d.OnKafkaAhead == AheadHalt, Halt: func(h engine.Halt) error { return haltError(d.Schema, h) },
		AdoptNewLog: d.OnLogChange.adoptNewLog(),
	}, nil
}

// stuckAfter is how long a handler call may run before the loop reports it stuck (logged
// once with its partition and offset, Readiness.Stuck, kafkatx_partition_stuck): the
// transaction's statement_timeout plus its idle_in_transaction_session_timeout
// (Config.Transaction; 70 s by default) — past both, the call cannot be doing useful work in
// its transaction. A negative field means "off" here as in beginSQL (TransactionConfig's one
// rule): with either bound off the loop knows no bound of the call, and reports none stuck (0).
func stuckAfter(t TransactionConfig) time.Duration {
	if t.StatementTimeout < 0 || t.IdleTimeout < 0 {
		return 0
	}
	return t.StatementTimeout + t.IdleTimeout
}
