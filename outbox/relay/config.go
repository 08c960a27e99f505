package relay

import (
	"errors"
	"fmt"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/outbox/internal/publish"
	"github.com/kafkatx/kafkatx/pg"
	"github.com/kafkatx/kafkatx/retention"
)

// Config configures a Relay. A nil *Config is not accepted: Kafka's bootstrap.servers is
// required. The zero value of every other field means its default.
type Config struct {
	// Kafka is passed to librdkafka's producer as is (bootstrap.servers is required; security
	// settings such as security.protocol, sasl.* and ssl.* pass through). The relay sets, unless
	// given here: enable.idempotence=true, acks=all, partitioner=murmur2_random (the Java
	// client's partitioner, so keys land where Java producers put them), linger.ms=5,
	// message.timeout.ms=60000, topic.metadata.propagation.max.ms=2000 (see
	// publish.ProducerDefaults), go.delivery.report.fields=none (delivery reports carry no
	// copy of the key and value), and go.events.channel.size=1000 and
	// go.produce.channel.size=1 (kafkaprops.SmallGoChannels). enable.idempotence=false, acks other
	// than all/-1 and transactional.id are refused (New's error; the rule is both relays'
	// and relays.CheckKafka applies it before anything connects).
	Kafka kafka.ConfigMap

	// Schema holds the outbox table. Defaults to "kafkatx".
	Schema string

	// Session configures the relay's dedicated connection, which holds the leadership lock (a
	// session-level advisory lock) and LISTENs for the outbox's NOTIFY: it must reach
	// PostgreSQL directly or through a session pooler. Set it when the pool goes through a
	// transaction pooler (PgBouncer pool_mode=transaction); rows are still read and marked
	// through the pool. Defaults to the pool's connection configuration. Either way the relay
	// checks the session (pg.RequireSession) before it campaigns and, through a transaction
	// pooler, logs the refusal and retries with backoff instead of leading unfenced.
	Session *pgx.ConnConfig

	// Logger receives the relay's logs, named "kafkatx.relay". Record keys and values and
	// Kafka secrets are never logged. Defaults to zap.NewNop().
	Logger *zap.Logger

	// BatchSize is the most records read, produced and marked per round: rows, or the
	// records of packed rows (a pack is read whole, so a round may pass it by one pack's
	// records, at most outbox.PackMaxRecords). Defaults to 1000.
	BatchSize int

	// PollInterval is how often an idle leader reads the outbox when no NOTIFY arrives (the
	// fallback for lost notifications or triggers bypassed). Defaults to 1s.
	PollInterval time.Duration

	// StandbyInterval is how often a standby relay tries to take the leadership lock, so it
	// takes over within about this long after the leader's database session ends. Defaults
	// to 1s.
	StandbyInterval time.Duration

	// Backoff is the wait after a round with retriable failures (the broker or the database
	// is unavailable): InitialBackoff, doubling up to MaxBackoff. Defaults to 250ms and 30s.
	InitialBackoff time.Duration
	MaxBackoff     time.Duration

	// UnknownTopicTimeout is how long rows for a topic that does not exist wait (set aside,
	// so other topics flow) before they are parked, from when this leader first found the
	// topic missing: room for a topic just created to show in the brokers' metadata. Defaults
	// to 10s (30s before issue 48: a record for a missing topic stayed pending, out of sight of
	// kafkatx outbox parked and the console, for half a minute; the WAL relay parks at once).
	UnknownTopicTimeout time.Duration

	// ShutdownTimeout bounds how long Run waits for the delivery reports of records already
	// produced once its context is cancelled, before it marks what was delivered and returns.
	// Records not confirmed by then stay pending and are published again later (same outbox
	// id). Defaults to 30s.
	ShutdownTimeout time.Duration

	// LeaderTimeout is how long the leader's session may stay silent before PostgreSQL ends
	// it (idle_session_timeout on that session alone, PostgreSQL 14+), releasing the
	// leadership lock to a standby: a leader frozen (SIGSTOP, a paused VM, a stuck process)
	// otherwise holds the lock for as long as it is frozen, since its kernel still answers
	// TCP keepalives, and nothing is published meanwhile. A running leader touches its
	// session at least every LeaderTimeout/4 — around each round, in its backoff, while it
	// waits for delivery reports — so it is not deposed; it should exceed ReadTimeout, the
	// longest wait it does not touch the session in. A frozen leader that comes back finds its
	// session ended and stands by; records it had already sent are published again (same
	// outbox ids). Defaults to 60s (as PostgreSQL's wal_sender_timeout bounds the WAL relay's
	// takeover); negative: off.
	LeaderTimeout time.Duration

	// ReadTimeout bounds one read of pending rows (a round's fetch): a read still running
	// after it is cancelled and the round fails as a database error would (logged, retried
	// after Backoff, counted by readiness), instead of holding the relay silently — a plan
	// gone bad, a lock held on the outbox. Defaults to 30s; a healthy read of a 1,000-row
	// round takes 2–10 ms (docs/relay.md).
	ReadTimeout time.Duration

	// KeepPublished is how long a published row stays in the outbox table (state published)
	// before the janitor deletes it, for inspection. Defaults to 0: the relay deletes a row as
	// soon as the broker acknowledged it (the cheapest). Negative keeps published rows forever.
	KeepPublished time.Duration

	// MetricsInterval is how often every relay, leader or standby, refreshes the backlog
	// gauges, at most: it waits
	// at least 20 times as long as the last count took (a long backlog is slow to count).
	// Defaults to 5s.
	MetricsInterval time.Duration

	// Janitor configures the retention janitor that the leader runs.
	Janitor JanitorConfig

	// Registerer receives the relay's Prometheus metrics (docs/relay.md lists them). Defaults
	// to none (Stats still works).
	Registerer prometheus.Registerer

	// Hooks receive the relay's events (published, parked, retried, backlog, leadership,
	// janitor deletions): each a value that implements one or more of the Hook* interfaces
	// (see Hook), called after the relay's own Prometheus hook, in order. Defaults to none.
	Hooks []Hook
}

// JanitorConfig configures the retention the leader runs (package retention: attempt rows,
// resolved dead letters, expired idempotency keys; with Config.KeepPublished, published and
// discarded outbox rows). The table relay's own bookkeeping rides along: it removes the
// outbox_commits rows of finished transactions and adopts outbox rows written with the
// table's triggers disabled. The WAL relay runs the same retention (walrelay.Config.Retention).
type JanitorConfig = retention.Config

// Defaults of Config's fields (the kafkatx relay command's flags read them).
const (
	DefaultBatchSize           = 1000
	DefaultPollInterval        = time.Second
	DefaultStandbyInterval     = time.Second
	DefaultInitialBackoff      = 250 * time.Millisecond
	DefaultMaxBackoff          = 30 * time.Second
	DefaultUnknownTopicTimeout = 10 * time.Second
	DefaultShutdownTimeout     = 30 * time.Second
	DefaultMetricsInterval     = 5 * time.Second
	DefaultReadTimeout         = 30 * time.Second
	DefaultLeaderTimeout       = 60 * time.Second
	DefaultKeepPublished       = time.Duration(0)
)

func (c *Config) withDefaults() (*Config, error) {
	if c == nil {
		return nil, errors.New("relay: nil *Config: Kafka bootstrap.servers is required")
	}
	out := *c
	out.Kafka = kafka.ConfigMap{}
	for k, v := range c.Kafka {
		out.Kafka[k] = v
	}
	if v, ok := out.Kafka["bootstrap.servers"]; !ok || fmt.Sprint(v) == "" {
		return nil, errors.New(`relay: Config.Kafka needs "bootstrap.servers"`)
	}
	if err := publish.RefuseSettings(out.Kafka); err != nil {
		return nil, fmt.Errorf("relay: Config.Kafka %w", err)
	}
	setDefault := func(k string, v kafka.ConfigValue) {
		if _, ok := out.Kafka[k]; !ok {
			out.Kafka[k] = v
		}
	}
	setDefault("enable.idempotence", true)
	if _, ok := out.Kafka["request.required.acks"]; !ok {
		setDefault("acks", "all")
	}
	publish.ProducerDefaults(out.Kafka) // partitioner=murmur2_random, linger.ms=5, topic.metadata.propagation.max.ms=2000, go.delivery.report.fields=none, small Go channels
	setDefault("message.timeout.ms", 60000)
	setDefault("go.logs.channel.enable", false)
	out.Schema = pg.SchemaOr(out.Schema)
	if out.Logger == nil {
		out.Logger = zap.NewNop()
	}
	out.Logger = out.Logger.Named("kafkatx.relay")
	if out.BatchSize <= 0 {
		out.BatchSize = DefaultBatchSize
	}
	if out.PollInterval <= 0 {
		out.PollInterval = DefaultPollInterval
	}
	if out.StandbyInterval <= 0 {
		out.StandbyInterval = DefaultStandbyInterval
	}
	if out.InitialBackoff <= 0 {
		out.InitialBackoff = DefaultInitialBackoff
	}
	if out.MaxBackoff <= 0 {
		out.MaxBackoff = DefaultMaxBackoff
	}
	if out.UnknownTopicTimeout <= 0 {
		out.UnknownTopicTimeout = DefaultUnknownTopicTimeout
	}
	if out.ShutdownTimeout <= 0 {
		out.ShutdownTimeout = DefaultShutdownTimeout
	}
	if out.MetricsInterval <= 0 {
		out.MetricsInterval = DefaultMetricsInterval
	}
	if out.ReadTimeout <= 0 {
		out.ReadTimeout = DefaultReadTimeout
	}
	if out.LeaderTimeout == 0 {
		out.LeaderTimeout = DefaultLeaderTimeout
	}
	out.Janitor = out.Janitor.WithDefaults()
	return &out, nil
}
