package kafkatx

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
)

// parkedGauge returns the value of gauge name (kafkatx_parked_keys or
// kafkatx_parked_messages) for group's topic and partition 0 in reg, and whether reg has it.
func parkedGauge(t *testing.T, reg *prometheus.Registry, name, group, topic string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			if l["group"] == group && l["topic"] == topic && l["partition"] == "0" {
				return m.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}

// Issue 45, operators: the consumer exports kafkatx_parked_keys and kafkatx_parked_messages per
// partition (0 for a partition with nothing parked, from the loop's own counts), and a parked
// key alone does not make the consumer not ready: the partition's other keys go on.
func TestParkedKeysMetricsAndReadiness(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, keyedRecords(100, 10))
	var down atomic.Bool
	down.Store(true)
	reg := prometheus.NewRegistry()
	cfg := b.config(t)
	cfg.Registerer = reg
	cfg.Park.Enabled = true
	cfg.Retry.MaxAttempts = 1000
	r := b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if string(m.Key) == "k3" && down.Load() {
			return errors.New("tenant 3's service answered 503")
		}
		return applyEffect(ctx, tx, b.schema, m)
	}, cfg)
	r.waitFor(t, 90*time.Second, "the other keys' 90 messages applied and k3's 10 parked", func() bool {
		return b.q(t, "SELECT count(*) FROM {{schema}}.effects") == 90 && b.q(t, "SELECT count(*) FROM {{schema}}.key_parking") == 10
	})
	r.waitFor(t, 10*time.Second, "the gauges at one parked key, 10 parked messages", func() bool {
		k, _ := parkedGauge(t, reg, "kafkatx_parked_keys", b.group, b.topic)
		m, _ := parkedGauge(t, reg, "kafkatx_parked_messages", b.group, b.topic)
		return k == 1 && m == 10
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.c.Ready(ctx); err != nil {
		t.Fatalf("not ready with one key parked and the others flowing: %v", err)
	}
	down.Store(false)
	r.waitFor(t, 60*time.Second, "k3 applied after it recovers and the gauges back at 0", func() bool {
		k, okK := parkedGauge(t, reg, "kafkatx_parked_keys", b.group, b.topic)
		m, okM := parkedGauge(t, reg, "kafkatx_parked_messages", b.group, b.topic)
		return b.q(t, "SELECT count(*) FROM {{schema}}.effects") == 100 && okK && okM && k == 0 && m == 0
	})
	if err := r.c.Ready(ctx); err != nil {
		t.Fatalf("not ready after the key recovered: %v", err)
	}
}
