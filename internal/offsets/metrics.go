package offsets

import (
	"fmt"
	"io"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/kafkatx/kafkatx/internal/offsetstate"
)

// WritePrometheus writes statuses in the Prometheus text exposition format, for
// node_exporter's textfile collector or a Pushgateway, so drift is watched while no consumer
// runs (when an out-of-band reset usually happens). kafkatx_offset_drift and
// kafkatx_partition_lag have the consumer's names, labels and meaning; a partition lacking
// one side has no drift sample. Every partition with a watermark gets kafkatx_offset_aligned
// (1 aligned, 0 drifted), which alerts on a missing committed offset too, and
// kafkatx_offset_log_changed (1 when the log behind the watermark is another one).
func WritePrometheus(w io.Writer, sts []PartitionStatus) error {
	labels := []string{"group", "topic", "partition"}
	gauge := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
	}
	drift := gauge("kafkatx_offset_drift", "Kafka committed offset minus database watermark (0 when aligned).")
	lag := gauge("kafkatx_partition_lag", "Log end offset minus database watermark, in messages.")
	aligned := gauge("kafkatx_offset_aligned", "1 when Kafka's committed offset equals the database watermark, else 0.")
	watermark := gauge("kafkatx_offset_watermark", "Database watermark: the next offset to process.")
	committed := gauge("kafkatx_offset_committed", "Kafka committed offset of the group.")
	logEnd := gauge("kafkatx_offset_log_end", "Log end offset of the partition.")
	logChanged := gauge("kafkatx_offset_log_changed", "1 when the log behind the watermark is another one (topic recreated, another cluster: the consumer refuses to start), else 0.")
	reg := prometheus.NewPedanticRegistry()
	for _, c := range []prometheus.Collector{drift, lag, aligned, watermark, committed, logEnd, logChanged} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register gauge: %w", err)
		}
	}
	for _, s := range sts {
		l := prometheus.Labels{"group": s.Group, "topic": s.Topic, "partition": strconv.Itoa(int(s.Partition))}
		logEnd.With(l).Set(float64(s.LogEnd))
		if s.Committed != nil {
			committed.With(l).Set(float64(*s.Committed))
		}
		if s.Watermark == nil {
			continue
		}
		watermark.With(l).Set(float64(*s.Watermark))
		lag.With(l).Set(float64(s.Lag))
		if s.Drift != nil {
			drift.With(l).Set(float64(*s.Drift))
		}
		v := 0.0
		if s.State == offsetstate.Aligned {
			v = 1
		}
		aligned.With(l).Set(v)
		v = 0
		if s.State == offsetstate.LogChanged {
			v = 1
		}
		logChanged.With(l).Set(v)
	}
	mfs, err := reg.Gather()
	if err != nil {
		return fmt.Errorf("gather gauges: %w", err)
	}
	enc := expfmt.NewEncoder(w, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			return fmt.Errorf("write metrics: %w", err)
		}
	}
	return nil
}
