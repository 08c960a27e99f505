package kafkatx

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kafkatx/kafkatx/internal/engine"
	"github.com/kafkatx/kafkatx/internal/metrics"
)

// promHook is the consumer's Prometheus metrics, kept as one of its hooks (hooks.go), the
// first in the hook set: every metric is moved here from the public hooks' events and nowhere
// else, so adding a metric is a change to this file alone (TestEveryEventReachesHooksStatsAndMetrics
// checks that every event of the engine reaches it, or says why it has no metric). Names follow the Prometheus naming guide; docs/consumer.md lists
// them.
type promHook struct{ c *metrics.Consumer }

// newPromHook creates the consumer's collectors and registers them with reg (nil: none): see
// metrics.NewConsumer.
func newPromHook(reg prometheus.Registerer) (*promHook, error) {
	c, err := metrics.NewConsumer(reg)
	if err != nil {
		return nil, err
	}
	return &promHook{c: c}, nil
}

// watchParked makes loop's parked counts (Config.Park) the source of the gauges
// kafkatx_parked_keys and kafkatx_parked_messages of group, read at each scrape (no event
// moves them: metrics.Parked).
func (m *promHook) watchParked(group string, loop *engine.Loop) {
	m.c.Parked.Add(func() []metrics.ParkedPartition {
		var out []metrics.ParkedPartition
		for _, p := range loop.Parked() {
			out = append(out, metrics.ParkedPartition{Group: group, Topic: p.TP.Topic, Partition: p.TP.Partition, Keys: p.Keys, Messages: p.Messages})
		}
		return out
	})
}

func partitionLabel(p int32) string { return strconv.Itoa(int(p)) }

func (m *promHook) OnBatchCommitted(e BatchCommitted) {
	if e.Processed > 0 {
		m.c.Processed.WithLabelValues(e.Group, e.Topic).Add(float64(e.Processed))
	}
	if e.Duplicates > 0 {
		m.c.Duplicates.WithLabelValues(e.Group, e.Topic).Add(float64(e.Duplicates))
	}
	if e.NotChanges > 0 {
		m.c.NotChanges.WithLabelValues(e.Group, e.Topic).Add(float64(e.NotChanges))
	}
	m.c.BatchSeconds.Observe(e.Duration.Seconds())
}

func (m *promHook) OnRedeliveryDropped(e RedeliveryDropped) {
	m.c.Duplicates.WithLabelValues(e.Group, e.Topic).Add(float64(e.Count))
}

func (m *promHook) OnRetryScheduled(e RetryScheduled) {
	m.c.Retries.WithLabelValues(e.Group, e.Topic).Inc()
}

func (m *promHook) OnDeadLettered(e DeadLettered) {
	m.c.DeadLetters.WithLabelValues(e.Group, e.Topic, e.ErrorClass).Inc()
}

func (m *promHook) OnPartitionReconciled(e PartitionReconciled) {
	m.c.Drift.WithLabelValues(e.Group, e.Topic, partitionLabel(e.Partition)).Set(float64(e.Drift))
}

func (m *promHook) OnOffsetsSkipped(e OffsetsSkipped) {
	m.c.Skipped.WithLabelValues(e.Group, e.Topic, e.Kind).Add(float64(e.To - e.From))
}

func (m *promHook) OnRollbackReplayed(e RollbackReplayed) {
	m.c.RolledBack.WithLabelValues(e.Group, e.Topic).Add(float64(e.To - e.From))
}

func (m *promHook) OnDependencyUnavailable(e DependencyUnavailable) {
	m.c.Unavailable.WithLabelValues(e.Group, e.Topic).Inc()
	m.c.Waiting.WithLabelValues(e.Group, e.Topic, partitionLabel(e.Partition)).Set(1)
}

func (m *promHook) OnDependencyAvailable(e DependencyAvailable) {
	m.c.Waiting.WithLabelValues(e.Group, e.Topic, partitionLabel(e.Partition)).Set(0)
}

func (m *promHook) OnPartitionLag(e PartitionLag) {
	m.c.Lag.WithLabelValues(e.Group, e.Topic, partitionLabel(e.Partition)).Set(float64(e.Lag))
}

func (m *promHook) OnBreakerChanged(e BreakerChanged) {
	if e.Open {
		m.c.BreakerOpen.WithLabelValues(e.Group).Set(1)
		m.c.BreakerOpens.WithLabelValues(e.Group).Inc()
		return
	}
	m.c.BreakerOpen.WithLabelValues(e.Group).Set(0)
}

func (m *promHook) OnHandlerStuck(e HandlerStuck) {
	m.c.Stuck.WithLabelValues(e.Group, e.Topic, partitionLabel(e.Partition)).Set(oneIf(e.Stuck))
}

func (m *promHook) OnPartitionStalled(e PartitionStalled) {
	m.c.Stalled.WithLabelValues(e.Group, e.Topic, partitionLabel(e.Partition)).Set(oneIf(e.Stalled))
}

func (m *promHook) OnLogChanged(e LogChanged) {
	action := "halt"
	if e.Adopted {
		action = "adopt"
	}
	m.c.LogChanges.WithLabelValues(e.Group, e.Topic, action).Inc()
}

// oneIf is a 0/1 gauge's value.
func oneIf(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
