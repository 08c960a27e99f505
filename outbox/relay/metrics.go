package relay

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kafkatx/kafkatx/internal/promreg"
)

// Stats are the relay's counters since New. Safe to call from any goroutine.
type Stats struct {
	// Published counts rows whose delivery the broker acknowledged.
	Published int64
	// Parked counts rows parked because the broker refused them for good.
	Parked int64
	// Retried counts deliveries that failed with a retriable error (the rows stay pending).
	Retried int64
	// Leader reports whether this relay holds the outbox's leadership lock now.
	Leader bool
	// LastContact is when the relay last completed a database round trip (a leadership
	// attempt or a publishing round); the zero Unix time before the first.
	LastContact time.Time
}

type counters struct {
	published, parked, retried atomic.Int64
	leader                     atomic.Bool
	alone                      atomic.Int64 // productions with one record in flight (tests)
}

// promHook is the relay's Prometheus metrics, kept as one of its hooks (hooks.go): every
// metric is moved here from the relay's events and nowhere else, so adding a metric is a
// change to this file alone. docs/relay.md lists them.
type promHook struct {
	backlog   prometheus.Gauge
	oldest    prometheus.Gauge
	parkedNow prometheus.Gauge
	leader    prometheus.Gauge
	published *prometheus.CounterVec
	parked    *prometheus.CounterVec
	retried   *prometheus.CounterVec
	latency   prometheus.Histogram
	deleted   *prometheus.CounterVec
	rounds    prometheus.Counter
	roundStep *prometheus.CounterVec
}

var (
	_ HookPublished       = (*promHook)(nil)
	_ HookParked          = (*promHook)(nil)
	_ HookPublishRetried  = (*promHook)(nil)
	_ HookBacklogMeasured = (*promHook)(nil)
	_ HookLeadership      = (*promHook)(nil)
	_ HookJanitorDeleted  = (*promHook)(nil)
	_ HookRound           = (*promHook)(nil)
)

// newPromHook creates the relay's collectors and registers them with reg (nil: none). A
// collector reg already holds is shared; any other refusal is returned.
func newPromHook(reg prometheus.Registerer, schema string) (*promHook, error) {
	l := prometheus.Labels{"schema": schema}
	m := &promHook{
		backlog: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kafkatx_outbox_backlog_rows", ConstLabels: l,
			Help: "Outbox records waiting to be published: rows, a packed row counting its records (parked rows and rows waiting behind them excluded)."}),
		oldest: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kafkatx_outbox_oldest_age_seconds", ConstLabels: l,
			Help: "Age of the oldest outbox row waiting to be published, in seconds (0 when none)."}),
		parkedNow: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kafkatx_outbox_parked_rows", ConstLabels: l,
			Help: "Outbox rows parked now, waiting for an operator (kafkatx outbox release|discard)."}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kafkatx_outbox_relay_leader", ConstLabels: l,
			Help: "1 while this relay holds the outbox's leadership lock and publishes, else 0."}),
		published: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kafkatx_outbox_published_total", ConstLabels: l,
			Help: "Outbox records acknowledged by the broker."}, []string{"topic"}),
		parked: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kafkatx_outbox_parked_total", ConstLabels: l,
			Help: "Outbox records parked because the broker refused them for good."}, []string{"topic"}),
		retried: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kafkatx_outbox_publish_retries_total", ConstLabels: l,
			Help: "Outbox deliveries that failed with a retriable error and will be tried again."}, []string{"topic"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kafkatx_outbox_publish_latency_seconds", ConstLabels: l,
			Help:    "Time from the outbox row's insert (created_at, database clock) to the broker's acknowledgement.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 18)}),
		deleted: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kafkatx_janitor_deleted_rows_total", ConstLabels: l,
			Help: "Rows deleted by the retention janitor, by table."}, []string{"table"}),
		rounds: prometheus.NewCounter(prometheus.CounterOpts{Name: "kafkatx_outbox_relay_rounds_total", ConstLabels: l,
			Help: "Publishing rounds that produced rows."}),
		roundStep: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kafkatx_outbox_relay_round_seconds_total", ConstLabels: l,
			Help: "Time the leader spent in its rounds, by step: read (waiting for rows), produce (until the last delivery report), mark_wait (waiting for the previous mark)."},
			[]string{"step"}),
	}
	var err error
	promreg.Into(reg, &m.backlog, &err)
	promreg.Into(reg, &m.oldest, &err)
	promreg.Into(reg, &m.parkedNow, &err)
	promreg.Into(reg, &m.leader, &err)
	promreg.Into(reg, &m.published, &err)
	promreg.Into(reg, &m.parked, &err)
	promreg.Into(reg, &m.retried, &err)
	promreg.Into(reg, &m.latency, &err)
	promreg.Into(reg, &m.deleted, &err)
	promreg.Into(reg, &m.rounds, &err)
	promreg.Into(reg, &m.roundStep, &err)
	if err != nil {
		return nil, err
	}
	return m, nil
}

func (m *promHook) OnPublished(e Published) {
	m.published.WithLabelValues(e.Topic).Inc()
	m.latency.Observe(e.Latency.Seconds())
}

func (m *promHook) OnParked(e Parked) { m.parked.WithLabelValues(e.Topic).Inc() }

func (m *promHook) OnPublishRetried(e PublishRetried) { m.retried.WithLabelValues(e.Topic).Inc() }

func (m *promHook) OnBacklogMeasured(e BacklogMeasured) {
	m.backlog.Set(float64(e.Rows))
	m.oldest.Set(e.OldestAge.Seconds())
	m.parkedNow.Set(float64(e.Parked))
}

func (m *promHook) OnLeadership(e Leadership) {
	if e.Leader {
		m.leader.Set(1)
	} else {
		m.leader.Set(0)
	}
}

func (m *promHook) OnJanitorDeleted(e JanitorDeleted) {
	m.deleted.WithLabelValues(e.Table).Add(float64(e.Rows))
}

func (m *promHook) OnRound(e Round) {
	m.rounds.Inc()
	m.roundStep.WithLabelValues("read").Add(e.Read.Seconds())
	m.roundStep.WithLabelValues("produce").Add(e.Produce.Seconds())
	m.roundStep.WithLabelValues("mark_wait").Add(e.MarkWait.Seconds())
}
