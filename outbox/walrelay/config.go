package walrelay

import (
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/retention"
)

// Config configures a WAL relay.
type Config struct {
	// Kafka is the producer's base configuration (bootstrap.servers and security settings).
	// The relay sets transactional.id (TransactionalIDPrefix + slot name), enable.idempotence
	// and acks=all, and, unless given, partitioner=murmur2_random (the Java client's, as the
	// table relay) and linger.ms=5. As the table relay, New refuses enable.idempotence other
	// than true, acks other than all/-1 and a transactional.id (relays.CheckKafka).
	Kafka kafka.ConfigMap
	// Schema holds kafkatx's tables and names the slot. Defaults to "kafkatx".
	Schema string
	// Replication is the connection the relay streams from: a direct or session-pooled
	// connection to the database (the relay adds replication=database). Required.
	Replication *pgx.ConnConfig
	// CheckpointTopic is the compacted topic holding, per slot, the commit LSN the relay has
	// published through, written in the same Kafka transaction as the records. Created
	// (1 partition, cleanup.policy=compact) when missing. Defaults to
	// "kafkatx.wal-checkpoints"; New refuses a name Kafka refuses (1 to 249 characters of
	// [a-zA-Z0-9._-], not "." or "..").
	CheckpointTopic string
	// TransactionalIDPrefix is prefixed to the slot name to make the producer's
	// transactional.id. Defaults to "kafkatx-wal-".
	TransactionalIDPrefix string
	// MaxBatchRecords closes a Kafka transaction at the next decoded transaction's end once
	// it holds this many records. Defaults to 50,000.
	MaxBatchRecords int
	// Linger: a Kafka transaction open this long (since its first record) is committed at
	// the first pause of the stream (1 ms without data) at a decoded transaction's end.
	// Defaults to 20 ms.
	Linger time.Duration
	// MaxLinger: a Kafka transaction open this long is committed at the next decoded
	// transaction's end even while data keeps flowing (a backlog), so commits are amortized
	// over more records without holding them longer than this. Defaults to 250 ms.
	MaxLinger time.Duration
	// StatusInterval is how often the relay reports its confirmed position to the server
	// and reads the slot's state (metrics, warnings). Defaults to 1 s.
	StatusInterval time.Duration
	// RetryInterval is the wait before reconnecting after an error, and between tries
	// while another relay holds the slot (SQLSTATE 55006). Defaults to 1 s.
	RetryInterval time.Duration
	// WarnRetainedFraction: the relay warns when the slot's retained WAL passes this
	// fraction of max_slot_wal_keep_size (when set). Defaults to 0.5.
	WarnRetainedFraction float64
	// Retention configures the retention the relay runs while it holds the slot (package
	// retention: attempt rows, resolved dead letters, expired idempotency keys), as the table
	// relay's leader does. Defaults: retention.Config's.
	Retention retention.Config
	Logger    *zap.Logger
	// Registerer, when set, receives the relay's metrics (kafkatx_walrelay_*).
	Registerer prometheus.Registerer
}

func (c Config) withDefaults() Config {
	if c.Schema == "" {
		c.Schema = "kafkatx"
	}
	if c.CheckpointTopic == "" {
		c.CheckpointTopic = "kafkatx.wal-checkpoints"
	}
	if c.TransactionalIDPrefix == "" {
		c.TransactionalIDPrefix = "kafkatx-wal-"
	}
	if c.MaxBatchRecords <= 0 {
		c.MaxBatchRecords = 50000
	}
	if c.Linger <= 0 {
		c.Linger = 20 * time.Millisecond
	}
	if c.MaxLinger < c.Linger {
		c.MaxLinger = max(c.Linger, 250*time.Millisecond)
	}
	if c.StatusInterval <= 0 {
		c.StatusInterval = time.Second
	}
	if c.RetryInterval <= 0 {
		c.RetryInterval = time.Second
	}
	if c.WarnRetainedFraction <= 0 {
		c.WarnRetainedFraction = 0.5
	}
	c.Retention = c.Retention.WithDefaults()
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	return c
}
