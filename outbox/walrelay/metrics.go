package walrelay

import (
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct{}

// newMetrics registers the relay's metrics on reg (none when nil): records published and
// parked, Kafka transactions, and the slot's retained WAL, lag, safe size and wal_status.
func newMetrics(reg prometheus.Registerer, r *Relay) (*metrics, error) {
	if reg == nil {
		return &metrics{}, nil
	}
	cs := []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kafkatx_walrelay_published_total", Help: "Records published in committed Kafka transactions."},
			func() float64 { return float64(r.published.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kafkatx_walrelay_parked_total", Help: "Records parked (refused by the broker, or undecodable)."},
			func() float64 { return float64(r.parked.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kafkatx_walrelay_transactions_total", Help: "Kafka transactions committed."},
			func() float64 { return float64(r.transactions.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kafkatx_walrelay_slot_retained_bytes", Help: "WAL the slot retains (current position - restart_lsn)."},
			func() float64 { return float64(r.Health().RetainedBytes) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kafkatx_walrelay_slot_lag_bytes", Help: "WAL not yet confirmed by the relay (current position - confirmed_flush_lsn)."},
			func() float64 { return float64(r.Health().LagBytes) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kafkatx_walrelay_slot_safe_bytes", Help: "WAL that may still be written before max_slot_wal_keep_size invalidates the slot; -1 unlimited."},
			func() float64 { return float64(r.Health().SafeBytes) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kafkatx_walrelay_slot_ready", Help: "1 while the relay can stream the slot: it exists, its wal_status is not lost, and no fatal error (such as its WAL removed on this server) stopped the relay."},
			func() float64 {
				if r.Health().Ready() {
					return 1
				}
				return 0
			}),
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return &metrics{}, nil
}
