// Package relays builds the relay of an outbox mode: the one constructor the sidecar
// (kafkatx relay) and an in-process relay (examples/internal/service) both call, so the choice
// of relay by mode, and what both relays are given (the producer's base configuration, the
// schema, the logger, the metrics registry, the session connection and the retention), are
// written once.
//
// Mode by mode: outbox.ModeTable is package outbox/relay (rows of <schema>.outbox, leader
// election by advisory lock); outbox.ModeWAL is package outbox/walrelay (the schema's
// replication slot, Kafka transactions with a checkpoint). Both are built on package
// outbox/internal/publish (refusal classes, topic limits, producer defaults) and run package
// retention. docs/design.md, "Adding an outbox mode", lists what a third mode touches.
package relays

import (
	"context"
	"fmt"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/outbox"
	"github.com/kafkatx/kafkatx/outbox/internal/publish"
	"github.com/kafkatx/kafkatx/outbox/leading"
	"github.com/kafkatx/kafkatx/outbox/relay"
	"github.com/kafkatx/kafkatx/outbox/walrelay"
	"github.com/kafkatx/kafkatx/pg"
	"github.com/kafkatx/kafkatx/retention"
)

// Relay is what every outbox relay does: *relay.Relay (table mode) and *walrelay.Relay (WAL
// mode) implement it; New returns one of them (type-assert for a mode's own Stats or Health).
type Relay interface {
	// Run publishes until ctx ends (then nil) or the relay cannot go on (an error).
	Run(ctx context.Context) error
	// Pending reports whether something written before the call may not be published yet
	// (--exit-when-idle).
	Pending(ctx context.Context) (bool, error)
	// Totals are the relay's counters since it was created, by name ("published",
	// "parked", and "retried" in table mode or "transactions" in WAL mode): the one-line
	// JSON kafkatx relay prints on exit.
	Totals() map[string]int64
	// Ready is nil unless the relay has failed to read or publish for its NotReadyAfter
	// (relay.NotReadyAfter, walrelay.NotReadyAfter: 10 s), then an error saying why: for the
	// readiness of the process that runs it (kafkatx.Consumer.AddReadinessCheck).
	Ready(ctx context.Context) error
}

// Options configures New.
type Options struct {
	// Mode is the schema's outbox mode (outbox.ReadSettings or outbox.EnsureMode). Required.
	Mode outbox.Mode
	// Kafka is the producer's base configuration (bootstrap.servers, security settings).
	Kafka kafka.ConfigMap
	// Schema holds kafkatx's tables. Defaults to "kafkatx".
	Schema     string
	Logger     *zap.Logger
	Registerer prometheus.Registerer
	// Session is a session (not transaction-pooled) connection: the table relay's leadership
	// lock and LISTEN, the WAL relay's replication stream. Defaults to pool's configuration.
	Session *pgx.ConnConfig
	// Retention is the retention the relay runs, in either mode (package retention).
	Retention retention.Config
	// Table and WAL hold each mode's own settings (BatchSize, PollInterval, ... for table
	// mode; MaxBatchRecords, Linger, ... for WAL mode); New sets their Kafka, Schema, Logger,
	// Registerer, session connection and retention from the fields above.
	Table relay.Config
	WAL   walrelay.Config
}

// CheckKafka returns an error naming the first setting of kc that both relays refuse
// (enable.idempotence other than true, acks other than all/-1, a transactional.id), or nil.
// relay.New and walrelay.New refuse the same settings; this checks them before anything
// connects, for a command line's usage error (kafkatx relay and the examples exit 2). The
// error names the property, never a value that could be a secret.
func CheckKafka(kc kafka.ConfigMap) error {
	if err := publish.RefuseSettings(kc); err != nil {
		return fmt.Errorf("kafka settings: %w", err)
	}
	return nil
}

// New returns the relay of o.Mode; an unknown mode is an error.
func New(pool *pgxpool.Pool, o Options) (Relay, error) {
	session := o.Session
	if session == nil && pool != nil {
		session = pool.Config().ConnConfig
	}
	switch o.Mode {
	case outbox.ModeTable:
		c := o.Table
		c.Kafka, c.Schema, c.Logger, c.Session, c.Janitor = o.Kafka, o.Schema, o.Logger, o.Session, o.Retention
		if o.Registerer != nil {
			c.Registerer = o.Registerer
		}
		return relay.New(pool, &c)
	case outbox.ModeWAL:
		c := o.WAL
		c.Kafka, c.Schema, c.Logger, c.Replication, c.Retention = o.Kafka, o.Schema, o.Logger, session, o.Retention
		if o.Registerer != nil {
			c.Registerer = o.Registerer
		}
		return walrelay.New(pool, c)
	}
	return nil, fmt.Errorf("relays: outbox mode %q: want %s or %s", o.Mode, outbox.ModeTable, outbox.ModeWAL)
}

// Leading reports whether a relay leads schema's outbox on q's database now and whether
// something waits to be published there, in the schema's stored mode: leading.Of, where the
// rule is written (the consumer's check of each shard's relay calls it directly, so the
// library does not link the relays' streaming code).
func Leading(ctx context.Context, q pg.Querier, schema string) (leader, pending bool, err error) {
	return leading.Of(ctx, q, schema)
}
