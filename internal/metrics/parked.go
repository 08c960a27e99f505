package metrics

import (
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// ParkedPartition is one partition's parked keys and parked messages (Config.Park).
type ParkedPartition struct {
	Group, Topic   string
	Partition      int32
	Keys, Messages int
}

// Parked is the collector of the gauges kafkatx_parked_keys and kafkatx_parked_messages
// (labels group, topic, partition): read at each scrape from its sources — each consumer's
// in-memory counts of the partitions it holds (engine.Loop.Parked) — so a scrape costs no
// database query, a partition revoked disappears from them, and an assigned partition with
// nothing parked shows 0. Consumers sharing a registry share one Parked (promreg), each adding
// its source.
type Parked struct {
	keys, messages *prometheus.Desc

	mu      sync.Mutex
	sources []func() []ParkedPartition
}

// NewParked returns a Parked with no source.
func NewParked() *Parked {
	labels := []string{"group", "topic", "partition"}
	return &Parked{
		keys: prometheus.NewDesc("kafkatx_parked_keys",
			"Keys of the partition parked in PostgreSQL (Config.Park): their messages wait while the partition's other keys go on.", labels, nil),
		messages: prometheus.NewDesc("kafkatx_parked_messages",
			"Messages of the partition parked in PostgreSQL (Config.Park), the parked keys' messages together.", labels, nil),
	}
}

// Add adds a source, called at each scrape (it must be quick and safe from any goroutine).
func (p *Parked) Add(src func() []ParkedPartition) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sources = append(p.sources, src)
}

// Describe implements prometheus.Collector.
func (p *Parked) Describe(ch chan<- *prometheus.Desc) {
	ch <- p.keys
	ch <- p.messages
}

// Collect implements prometheus.Collector.
func (p *Parked) Collect(ch chan<- prometheus.Metric) {
	p.mu.Lock()
	sources := append([]func() []ParkedPartition(nil), p.sources...)
	p.mu.Unlock()
	for _, src := range sources {
		for _, pp := range src() {
			part := strconv.Itoa(int(pp.Partition))
			ch <- prometheus.MustNewConstMetric(p.keys, prometheus.GaugeValue, float64(pp.Keys), pp.Group, pp.Topic, part)
			ch <- prometheus.MustNewConstMetric(p.messages, prometheus.GaugeValue, float64(pp.Messages), pp.Group, pp.Topic, part)
		}
	}
}
