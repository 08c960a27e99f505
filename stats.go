package kafkatx

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kafkatx/kafkatx/internal/promreg"
)

// Stats is a snapshot of a Consumer's counters since Run started.
type Stats struct {
	// Processed counts messages whose handler effects committed.
	Processed int64
	// Duplicates counts messages dropped without running the handler because they were done
	// before: their offset was already below the watermark (a redelivery after a rebalance or
	// a lost Kafka commit), or their business idempotency key (Config.Idempotency) was already
	// claimed in the group's replay epoch (a copy re-published at another offset).
	Duplicates int64
	// Retries counts tries after the first, crashes excluded.
	Retries int64
	// DeadLettered counts messages this consumer dead-lettered.
	DeadLettered int64
	// SkippedOffsets counts offsets skipped by following Kafka (operator or unexplained).
	SkippedOffsets int64
	// Pauses counts the times a partition stopped fetching because the messages held for it
	// exceeded its share of Config.MaxBufferedBytes (it resumes at half its share).
	Pauses int64
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
	// Unavailable counts handler answers of Unavailable that the loop waited out (each a
	// rolled-back try that counted no attempt).
	Unavailable int64
	// Waiting is the number of assigned partitions now waiting for a dependency their handler
	// reported Unavailable (their messages count in InFlight).
	Waiting int
}

type counters struct {
	processed, duplicates, retries, deadLettered, skipped, pauses, notChanges atomic.Int64
	unavailable                                                               atomic.Int64
	firstAssigned, lastMessage, lastCommit                                    atomic.Int64 // unix nanos
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
	unavailable  *prometheus.CounterVec
	waiting      *prometheus.GaugeVec
}

// newMetrics creates the consumer's collectors and registers them with reg (nil: none). A
// collector reg already holds is shared; any other refusal is returned.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
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
		unavailable: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kafkatx_dependency_unavailable_total", Help: "Handler answers of Unavailable waited out (tries rolled back, no attempt counted)."}, []string{"group", "topic"}),
		waiting:     prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kafkatx_partition_waiting", Help: "1 while the partition waits for a dependency its handler reported Unavailable."}, []string{"group", "topic", "partition"}),
	}
	var err error
	promreg.Into(reg, &m.processed, &err)
	promreg.Into(reg, &m.duplicates, &err)
	promreg.Into(reg, &m.retries, &err)
	promreg.Into(reg, &m.deadLetters, &err)
	promreg.Into(reg, &m.skipped, &err)
	promreg.Into(reg, &m.drift, &err)
	promreg.Into(reg, &m.lag, &err)
	promreg.Into(reg, &m.batchSeconds, &err)
	promreg.Into(reg, &m.unavailable, &err)
	promreg.Into(reg, &m.waiting, &err)
	promreg.Into(reg, &m.notChanges, &err)
	if err != nil {
		return nil, err
	}
	return m, nil
}
