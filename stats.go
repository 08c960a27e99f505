package kafkatx

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Stats is a snapshot of a Consumer's counters since Run started.
type Stats struct {
	// Processed counts messages whose handler effects committed.
	Processed int64
	// Duplicates counts messages dropped because their offset was already below the
	// watermark (a redelivery after a rebalance or a lost Kafka commit).
	Duplicates int64
	// Retries counts tries after the first, crashes excluded.
	Retries int64
	// DeadLettered counts messages this consumer dead-lettered.
	DeadLettered int64
	// SkippedOffsets counts offsets skipped by following Kafka (operator or unexplained).
	SkippedOffsets int64
	// NotChanges counts records the idempotency key function reported as not a change
	// (idempotency.ErrNotAChange: Debezium tombstones, heartbeats, transaction metadata):
	// committed past without running the handler, never dead-lettered.
	NotChanges int64
	// Assigned is the number of partitions currently assigned.
	Assigned int
	// InFlight is the number of received messages not yet committed, dead-lettered or
	// dropped, including those waiting in a backoff.
	InFlight int
	// FirstAssignedAt is when the consumer first held an assignment (zero before).
	FirstAssignedAt time.Time
	// LastMessageAt is when the last message arrived from Kafka (zero before).
	LastMessageAt time.Time
}

type counters struct {
	processed, duplicates, retries, deadLettered, skipped, notChanges atomic.Int64
	firstAssigned, lastMessage                                        atomic.Int64 // unix nanos
}

func unixNanoTime(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// metrics are the consumer's Prometheus collectors (names per the Prometheus naming guide).
type metrics struct {
	processed    *prometheus.CounterVec
	duplicates   *prometheus.CounterVec
	retries      *prometheus.CounterVec
	deadLetters  *prometheus.CounterVec
	skipped      *prometheus.CounterVec
	notChanges   *prometheus.CounterVec
	drift        *prometheus.GaugeVec
	lag          *prometheus.GaugeVec
	batchSeconds prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		processed:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kafkatx_messages_processed_total", Help: "Messages whose handler effects committed."}, []string{"group", "topic"}),
		duplicates:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kafkatx_messages_duplicate_total", Help: "Messages dropped because they were already below the watermark."}, []string{"group", "topic"}),
		retries:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kafkatx_message_retries_total", Help: "Handler tries after the first."}, []string{"group", "topic"}),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kafkatx_dead_letters_total", Help: "Messages dead-lettered."}, []string{"group", "topic", "error_class"}),
		skipped:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kafkatx_offsets_skipped_total", Help: "Offsets skipped by following Kafka's committed offset, by audit kind."}, []string{"group", "topic", "kind"}),
		notChanges:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kafkatx_messages_not_a_change_total", Help: "Records the idempotency key function reported as not a change (tombstones, heartbeats, transaction metadata); the handler did not run."}, []string{"group", "topic"}),
		drift:       prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kafkatx_offset_drift", Help: "Kafka committed offset minus database watermark, found on assignment (0 when aligned)."}, []string{"group", "topic", "partition"}),
		lag:         prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kafkatx_partition_lag", Help: "Log end offset minus database watermark, in messages."}, []string{"group", "topic", "partition"}),
		batchSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kafkatx_batch_duration_seconds", Help: "Time to run and commit one batch transaction.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.processed, m.duplicates, m.retries, m.deadLetters, m.skipped, m.notChanges, m.drift, m.lag, m.batchSeconds} {
			_ = reg.Register(c)
		}
	}
	return m
}
