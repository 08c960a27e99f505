package kafkatx

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kafkatx/kafkatx/internal/promreg"
)

// promHook is the consumer's Prometheus metrics, kept as one of its hooks (hooks.go), the
// first in the hook set: every metric is moved here from the public hooks' events and nowhere
// else, so adding a metric is a change to this file alone (TestEveryEventReachesHooksStatsAndMetrics
// checks that every event of the engine reaches it, or says why it has no metric). Names follow the Prometheus naming guide; docs/consumer.md lists
// them.
type promHook struct {
	processed    *prometheus.CounterVec
	duplicates   *prometheus.CounterVec
	retries      *prometheus.CounterVec
	deadLetters  *prometheus.CounterVec
	skipped      *prometheus.CounterVec
	rolledBack   *prometheus.CounterVec
	notChanges   *prometheus.CounterVec
	drift        *prometheus.GaugeVec
	lag          *prometheus.GaugeVec
	batchSeconds prometheus.Histogram
	unavailable  *prometheus.CounterVec
	waiting      *prometheus.GaugeVec
	breakerOpen  *prometheus.GaugeVec
	breakerOpens *prometheus.CounterVec
	stuck        *prometheus.GaugeVec
	stalled      *prometheus.GaugeVec
	logChanges   *prometheus.CounterVec
}

// newPromHook creates the consumer's collectors and registers them with reg (nil: none). A
// collector reg already holds is shared; any other refusal is returned.
func newPromHook(reg prometheus.Registerer) (*promHook, error) {
	m := &promHook{
		processed:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kafkatx_messages_processed_total", Help: "Messages whose handler effects committed."}, []string{"group", "topic"}),
		duplicates:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kafkatx_messages_duplicate_total", Help: "Messages dropped because they were already below the watermark."}, []string{"group", "topic"}),
		retries:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kafkatx_message_retries_total", Help: "Handler tries after the first."}, []string{"group", "topic"}),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kafkatx_dead_letters_total", Help: "Messages dead-lettered."}, []string{"group", "topic", "error_class"}),
		skipped:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kafkatx_offsets_skipped_total", Help: "Offsets skipped by following Kafka's committed offset, by audit kind."}, []string{"group", "topic", "kind"}),
		rolledBack:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kafkatx_offsets_rollback_replayed_total", Help: "Offsets re-processed because the database lost them (a failover, a restore; audit kind rollback_replayed)."}, []string{"group", "topic"}),
		notChanges:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kafkatx_messages_not_a_change_total", Help: "Records the idempotency key function reported as not a change (tombstones, heartbeats, transaction metadata); the handler did not run."}, []string{"group", "topic"}),
		drift:       prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kafkatx_offset_drift", Help: "Kafka committed offset minus database watermark, found on assignment (0 when aligned)."}, []string{"group", "topic", "partition"}),
		lag:         prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kafkatx_partition_lag", Help: "Log end offset minus database watermark, in messages."}, []string{"group", "topic", "partition"}),
		batchSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kafkatx_batch_duration_seconds", Help: "Time to run and commit one batch transaction.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
		unavailable:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kafkatx_dependency_unavailable_total", Help: "Handler answers of Unavailable waited out (tries rolled back, no attempt counted)."}, []string{"group", "topic"}),
		waiting:      prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kafkatx_partition_waiting", Help: "1 while the partition waits for a dependency its handler reported Unavailable."}, []string{"group", "topic", "partition"}),
		breakerOpen:  prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kafkatx_breaker_open", Help: "1 while the breaker holds the partitions whose messages fail alike (Config.Breaker)."}, []string{"group"}),
		breakerOpens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kafkatx_breaker_opened_total", Help: "Times the breaker opened (Config.Breaker)."}, []string{"group"}),
	}
	m.stuck = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kafkatx_partition_stuck", Help: "1 while the partition's handler call runs past its bound (Config.Transaction's statement plus idle timeouts)."}, []string{"group", "topic", "partition"})
	m.stalled = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kafkatx_partition_stalled", Help: "1 while the partition has lag and its watermark has not moved for Config.StallAfter, whatever the cause."}, []string{"group", "topic", "partition"})
	m.logChanges = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kafkatx_log_changes_total", Help: "Assignments that found the log behind a watermark changed (topic recreated, another cluster), by action: halt or adopt (Config.OnLogChange)."}, []string{"group", "topic", "action"})
	var err error
	promreg.Into(reg, &m.logChanges, &err)
	promreg.Into(reg, &m.stuck, &err)
	promreg.Into(reg, &m.stalled, &err)
	promreg.Into(reg, &m.breakerOpen, &err)
	promreg.Into(reg, &m.breakerOpens, &err)
	promreg.Into(reg, &m.processed, &err)
	promreg.Into(reg, &m.duplicates, &err)
	promreg.Into(reg, &m.retries, &err)
	promreg.Into(reg, &m.deadLetters, &err)
	promreg.Into(reg, &m.skipped, &err)
	promreg.Into(reg, &m.rolledBack, &err)
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

func partitionLabel(p int32) string { return strconv.Itoa(int(p)) }

func (m *promHook) OnBatchCommitted(e BatchCommitted) {
	if e.Processed > 0 {
		m.processed.WithLabelValues(e.Group, e.Topic).Add(float64(e.Processed))
	}
	if e.Duplicates > 0 {
		m.duplicates.WithLabelValues(e.Group, e.Topic).Add(float64(e.Duplicates))
	}
	if e.NotChanges > 0 {
		m.notChanges.WithLabelValues(e.Group, e.Topic).Add(float64(e.NotChanges))
	}
	m.batchSeconds.Observe(e.Duration.Seconds())
}

func (m *promHook) OnRedeliveryDropped(e RedeliveryDropped) {
	m.duplicates.WithLabelValues(e.Group, e.Topic).Add(float64(e.Count))
}

func (m *promHook) OnRetryScheduled(e RetryScheduled) {
	m.retries.WithLabelValues(e.Group, e.Topic).Inc()
}

func (m *promHook) OnDeadLettered(e DeadLettered) {
	m.deadLetters.WithLabelValues(e.Group, e.Topic, e.ErrorClass).Inc()
}

func (m *promHook) OnPartitionReconciled(e PartitionReconciled) {
	m.drift.WithLabelValues(e.Group, e.Topic, partitionLabel(e.Partition)).Set(float64(e.Drift))
}

func (m *promHook) OnOffsetsSkipped(e OffsetsSkipped) {
	m.skipped.WithLabelValues(e.Group, e.Topic, e.Kind).Add(float64(e.To - e.From))
}

func (m *promHook) OnRollbackReplayed(e RollbackReplayed) {
	m.rolledBack.WithLabelValues(e.Group, e.Topic).Add(float64(e.To - e.From))
}

func (m *promHook) OnDependencyUnavailable(e DependencyUnavailable) {
	m.unavailable.WithLabelValues(e.Group, e.Topic).Inc()
	m.waiting.WithLabelValues(e.Group, e.Topic, partitionLabel(e.Partition)).Set(1)
}

func (m *promHook) OnDependencyAvailable(e DependencyAvailable) {
	m.waiting.WithLabelValues(e.Group, e.Topic, partitionLabel(e.Partition)).Set(0)
}

func (m *promHook) OnPartitionLag(e PartitionLag) {
	m.lag.WithLabelValues(e.Group, e.Topic, partitionLabel(e.Partition)).Set(float64(e.Lag))
}

func (m *promHook) OnBreakerChanged(e BreakerChanged) {
	if e.Open {
		m.breakerOpen.WithLabelValues(e.Group).Set(1)
		m.breakerOpens.WithLabelValues(e.Group).Inc()
		return
	}
	m.breakerOpen.WithLabelValues(e.Group).Set(0)
}

func (m *promHook) OnHandlerStuck(e HandlerStuck) {
	m.stuck.WithLabelValues(e.Group, e.Topic, partitionLabel(e.Partition)).Set(oneIf(e.Stuck))
}

func (m *promHook) OnPartitionStalled(e PartitionStalled) {
	m.stalled.WithLabelValues(e.Group, e.Topic, partitionLabel(e.Partition)).Set(oneIf(e.Stalled))
}

func (m *promHook) OnLogChanged(e LogChanged) {
	action := "halt"
	if e.Adopted {
		action = "adopt"
	}
	m.logChanges.WithLabelValues(e.Group, e.Topic, action).Inc()
}

// oneIf is a 0/1 gauge's value.
func oneIf(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
