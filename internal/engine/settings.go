package engine

import (
	"context"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"
)

// Settings is what the loop needs of the user's kafkatx.Config, defaults applied and checked
// by package kafkatx (config.go), which documents each.
type Settings struct {
	Group  string
	Topics []string
	// Kafka is the librdkafka configuration as kafkatx runs it (auto commits off,
	// auto.offset.reset=earliest, the group protocol's defaults).
	Kafka kafka.ConfigMap
	// RouteLogs: librdkafka's logs go to Logger (the user did not set go.logs.channel.enable).
	RouteLogs bool
	// StartAtEnd: the user's auto.offset.reset starts a partition never run at the log end.
	StartAtEnd bool
	// ConsumerProtocol: group.protocol=consumer (KIP-848).
	ConsumerProtocol bool
	Schema           string
	// Placer maps partitions to shards at each assignment (shards.go); nil: one database.
	Placer Placer
	Logger *zap.Logger

	// BeginSQL opens a loop transaction with Config.Transaction's bounds; IdleTimeout is its
	// idle_in_transaction_session_timeout, named in a log hint.
	BeginSQL    string
	IdleTimeout time.Duration

	BatchSize int
	BatchWait time.Duration

	// Concurrency is the most units of one partition in flight at once, never two of one key
	// (lanes.go); 1 runs the partition in offset order. MaxUnits caps the units in flight over
	// the whole consumer (0: no cap).
	Concurrency int
	MaxUnits    int

	MaxAttempts int
	// ParkKeys parks a key in trouble (park.go); ParkMaxPerKey bounds a key's parked messages
	// (reached: its next message waits in its lane), ParkMaxKeys a partition's parked keys
	// (reached: a new failing key is retried in place). ≤ 0: no bound.
	ParkKeys      bool
	ParkMaxPerKey int
	ParkMaxKeys   int
	// Backoff is Config.Retry.Backoff: the wait before try attempt+1 (attempt >= 1).
	Backoff func(attempt int) time.Duration
	// UnavailableBackoff is the wait after the n-th consecutive Unavailable answer.
	UnavailableBackoff func(n int) time.Duration
	UnavailableMaxWait time.Duration
	// BreakerThreshold is how many distinct messages failing alike, with no success between,
	// open the breaker (≤ 0: never); BreakerProbe is a held partition's wait between tries
	// (breaker.go).
	BreakerThreshold int
	BreakerProbe     time.Duration

	// StuckAfter is how long a handler call may run before it is reported stuck (stuck.go);
	// ≤ 0: never.
	StuckAfter time.Duration
	// StallAfter is how long a partition with lag may hold its watermark still before the
	// watchdog reports it (stall.go); ≤ 0: never.
	StallAfter       time.Duration
	ShutdownTimeout  time.Duration
	CloseTimeout     time.Duration
	MaxValueBytes    int // 0: no limit
	MaxBufferedBytes int
	Backpressure     func(ctx context.Context) error
	// DeadLetterTopic names a dead letter's topic; nil keeps dead letters in the database only.
	DeadLetterTopic func(topic string) string
	HaltOnAhead     bool
	// AdoptNewLog is Config.OnLogChange: "" halts when the log behind a watermark changed
	// (identity.go), "earliest" or "latest" adopts the new log from its start or its end.
	AdoptNewLog string
	// Halt makes the error Run returns when reconciliation halts on a partition.
	Halt func(Halt) error

	// Signals are the test signals of this loop (nil in production).
	Signals *Signals
}

// Signals lets a test act at named steps of one loop, per instance (River's testsignal):
// Step is called with "polled", "handled" (the handler ran, the transaction not committed),
// "db-committed" (the database committed, Kafka not yet) and "dead-letter" (inside the
// dead-letter transaction), and the offset.
type Signals struct {
	Step func(step string, offset int64)
}

func (s *Signals) step(step string, offset int64) {
	if s != nil && s.Step != nil {
		s.Step(step, offset)
	}
}
