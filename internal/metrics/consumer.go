// Package metrics holds the consumer's Prometheus collectors: their names, help texts and
// labels (docs/consumer.md lists them), created and registered in one place. The root
// package's promHook moves them from the public hooks' events.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kafkatx/kafkatx/internal/promreg"
)

// Consumer is a consumer's collectors. Names follow the Prometheus naming guide.
type Consumer struct {
	Processed    *prometheus.CounterVec
	Duplicates   *prometheus.CounterVec
	Retries      *prometheus.CounterVec
	DeadLetters  *prometheus.CounterVec
	Skipped      *prometheus.CounterVec
	RolledBack   *prometheus.CounterVec
	NotChanges   *prometheus.CounterVec
	Drift        *prometheus.GaugeVec
	Lag          *prometheus.GaugeVec
	BatchSeconds prometheus.Histogram
	Unavailable  *prometheus.CounterVec
	Waiting      *prometheus.GaugeVec
	BreakerOpen  *prometheus.GaugeVec
	BreakerOpens *prometheus.CounterVec
	Stuck        *prometheus.GaugeVec
	Stalled      *prometheus.GaugeVec
	// ShardRelayUnowned is 1 per shard (Config.Shards) whose outbox rows have waited with no
	// relay leading for kafkatx.ShardUnrelayedAfter, else 0.
	ShardRelayUnowned *prometheus.GaugeVec
	LogChanges        *prometheus.CounterVec
	// Parked is read at each scrape from the consumers' in-memory counts (parked.go).
	Parked *Parked
}

// NewConsumer creates the consumer's collectors and registers them with reg (nil: none). A
// collector reg already holds is shared (promreg.Into); any other refusal is returned.
func NewConsumer(reg prometheus.Registerer) (*Consumer, error) {
	m := &Consumer{
		Processed:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kafkatx_messages_processed_total", Help: "Messages whose handler effects committed."}, []string{"group", "topic"}),
		Duplicates:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kafkatx_messages_duplicate_total", Help: "Messages dropped because they were already below the watermark."}, []string{"group", "topic"}),
		Retries:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kafkatx_message_retries_total", Help: "Handler tries after the first."}, []string{"group", "topic"}),
		DeadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kafkatx_dead_letters_total", Help: "Messages dead-lettered."}, []string{"group", "topic", "error_class"}),
		Skipped:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kafkatx_offsets_skipped_total", Help: "Offsets skipped by following Kafka's committed offset, by audit kind."}, []string{"group", "topic", "kind"}),
		RolledBack:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kafkatx_offsets_rollback_replayed_total", Help: "Offsets re-processed because the database lost them (a failover, a restore; audit kind rollback_replayed)."}, []string{"group", "topic"}),
		NotChanges:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kafkatx_messages_not_a_change_total", Help: "Records the idempotency key function reported as not a change (tombstones, heartbeats, transaction metadata); the handler did not run."}, []string{"group", "topic"}),
		Drift:       prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kafkatx_offset_drift", Help: "Kafka committed offset minus database watermark, found on assignment (0 when aligned)."}, []string{"group", "topic", "partition"}),
		Lag:         prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kafkatx_partition_lag", Help: "Log end offset minus database watermark, in messages."}, []string{"group", "topic", "partition"}),
		BatchSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kafkatx_batch_duration_seconds", Help: "Time to run and commit one batch transaction.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
		Unavailable:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kafkatx_dependency_unavailable_total", Help: "Handler answers of Unavailable waited out (tries rolled back, no attempt counted)."}, []string{"group", "topic"}),
		Waiting:      prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kafkatx_partition_waiting", Help: "1 while the partition waits for a dependency its handler reported Unavailable."}, []string{"group", "topic", "partition"}),
		BreakerOpen:  prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kafkatx_breaker_open", Help: "1 while the breaker holds the partitions whose messages fail alike (Config.Breaker)."}, []string{"group"}),
		BreakerOpens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kafkatx_breaker_opened_total", Help: "Times the breaker opened (Config.Breaker)."}, []string{"group"}),
	}
	m.Stuck = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kafkatx_partition_stuck", Help: "1 while the partition's handler call runs past its bound (Config.Transaction's statement plus idle timeouts)."}, []string{"group", "topic", "partition"})
	m.Stalled = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kafkatx_partition_stalled", Help: "1 while the partition has lag and its watermark has not moved for Config.StallAfter, whatever the cause."}, []string{"group", "topic", "partition"})
	m.LogChanges = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kafkatx_log_changes_total", Help: "Assignments that found the log behind a watermark changed (topic recreated, another cluster), by action: halt or adopt (Config.OnLogChange)."}, []string{"group", "topic", "action"})
	m.ShardRelayUnowned = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kafkatx_shard_relay_unowned", Help: "1 while the shard's outbox has waited with no relay leading it (no relay and no retention run there) for longer than a minute (Config.Shards; table mode: rows pending and nobody holds the leadership lock; WAL mode: the slot is inactive and behind the current WAL)."}, []string{"shard"})
	m.Parked = NewParked()
	var err error
	promreg.Into(reg, &m.Parked, &err)
	promreg.Into(reg, &m.LogChanges, &err)
	promreg.Into(reg, &m.Stuck, &err)
	promreg.Into(reg, &m.Stalled, &err)
	promreg.Into(reg, &m.ShardRelayUnowned, &err)
	promreg.Into(reg, &m.BreakerOpen, &err)
	promreg.Into(reg, &m.BreakerOpens, &err)
	promreg.Into(reg, &m.Processed, &err)
	promreg.Into(reg, &m.Duplicates, &err)
	promreg.Into(reg, &m.Retries, &err)
	promreg.Into(reg, &m.DeadLetters, &err)
	promreg.Into(reg, &m.Skipped, &err)
	promreg.Into(reg, &m.RolledBack, &err)
	promreg.Into(reg, &m.Drift, &err)
	promreg.Into(reg, &m.Lag, &err)
	promreg.Into(reg, &m.BatchSeconds, &err)
	promreg.Into(reg, &m.Unavailable, &err)
	promreg.Into(reg, &m.Waiting, &err)
	promreg.Into(reg, &m.NotChanges, &err)
	if err != nil {
		return nil, err
	}
	return m, nil
}
