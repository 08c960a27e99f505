package kafkatx

import (
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/engine"
	"github.com/kafkatx/kafkatx/internal/offsetstate"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
)

// everyHook implements every Hook* interface and keeps the events in the order they came.
type everyHook struct {
	mu     sync.Mutex
	events []any
}

func (h *everyHook) add(e any) { h.mu.Lock(); defer h.mu.Unlock(); h.events = append(h.events, e) }
func (h *everyHook) take() []any {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := h.events
	h.events = nil
	return out
}

func (h *everyHook) OnBatchCommitted(e BatchCommitted)               { h.add(e) }
func (h *everyHook) OnRedeliveryDropped(e RedeliveryDropped)         { h.add(e) }
func (h *everyHook) OnRetryScheduled(e RetryScheduled)               { h.add(e) }
func (h *everyHook) OnDeadLettered(e DeadLettered)                   { h.add(e) }
func (h *everyHook) OnFenced(e Fenced)                               { h.add(e) }
func (h *everyHook) OnPartitionReconciled(e PartitionReconciled)     { h.add(e) }
func (h *everyHook) OnPartitionsAssigned(e PartitionsAssigned)       { h.add(e) }
func (h *everyHook) OnPartitionsRevoked(e PartitionsRevoked)         { h.add(e) }
func (h *everyHook) OnOffsetsSkipped(e OffsetsSkipped)               { h.add(e) }
func (h *everyHook) OnRollbackReplayed(e RollbackReplayed)           { h.add(e) }
func (h *everyHook) OnDependencyUnavailable(e DependencyUnavailable) { h.add(e) }
func (h *everyHook) OnDependencyAvailable(e DependencyAvailable)     { h.add(e) }
func (h *everyHook) OnPartitionLag(e PartitionLag)                   { h.add(e) }
func (h *everyHook) OnPartitionPaused(e PartitionPaused)             { h.add(e) }
func (h *everyHook) OnBreakerChanged(e BreakerChanged)               { h.add(e) }
func (h *everyHook) OnHandlerStuck(e HandlerStuck)                   { h.add(e) }
func (h *everyHook) OnPartitionStalled(e PartitionStalled)           { h.add(e) }
func (h *everyHook) OnLogChanged(e LogChanged)                       { h.add(e) }

// eventsOf returns the events of type E h received so far.
func eventsOf[E any](h *everyHook) []E {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []E
	for _, e := range h.events {
		if v, ok := e.(E); ok {
			out = append(out, v)
		}
	}
	return out
}

// metricsText is everything reg holds, as text.
func metricsText(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		b.WriteString(mf.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// Every event the engine emits — every method of engine.Emitter — reaches users' hooks with
// its figures, moves the Stats counter it counts in (and no other), and reaches kafkatx's
// Prometheus metrics, which see the events only through the same public hooks (the check
// list kprom keeps as interface assertions, as a test). An Emitter method added without a row
// here fails, as does a Hook* interface that everyHook does not implement; an event without a
// metric names why.
func TestEveryEventReachesHooksStatsAndMetrics(t *testing.T) {
	const group = "g"
	tp := offsetstore.TP{Topic: "orders", Partition: 3}
	since := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	pos := []engine.Position{{TP: tp, Offset: 40}, {TP: offsetstore.TP{Topic: "orders", Partition: 4}, Offset: 7}}
	offs := []PartitionOffset{{Topic: "orders", Partition: 3, Offset: 40}, {Topic: "orders", Partition: 4, Offset: 7}}
	breaker := engine.BreakerState{Since: since, Signature: "SQLSTATE 42501 insufficient_privilege", SQLState: "42501",
		Example: "permission denied", Messages: 3, Held: []offsetstore.TP{{Topic: "b", Partition: 1}, tp}}
	change := offsetstate.LogChange{Recorded: offsetstate.LogID{Cluster: "c-old", Topic: "t-old"},
		Current: offsetstate.LogID{Cluster: "c-new", Topic: "t-new"}, Topic: true, Cluster: true}
	// In this order: a gauge set back (the breaker closing, a stall ending) changes the metrics
	// only after it was set.
	cases := []struct {
		method   string
		emit     func(engine.Emitter)
		want     any              // what users' hooks get
		stats    map[string]int64 // the Stats counters it moves, by field name
		noMetric string           // why the metrics do not count it ("": they must change)
	}{
		{method: "BatchCommitted", emit: func(e engine.Emitter) {
			e.BatchCommitted(tp, 10, 15, engine.Tried{Fresh: 3, Dups: []int{1}, NotChanges: []int{4}}, 20*time.Millisecond)
		}, want: BatchCommitted{Group: group, Topic: "orders", Partition: 3, FirstOffset: 10, NextOffset: 15, Processed: 3, Duplicates: 1, NotChanges: 1, Duration: 20 * time.Millisecond},
			stats: map[string]int64{"Processed": 3, "Duplicates": 1, "NotChanges": 1}},
		{method: "RedeliveryDropped", emit: func(e engine.Emitter) { e.RedeliveryDropped(tp, 2) },
			want:  RedeliveryDropped{Group: group, Topic: "orders", Partition: 3, Count: 2},
			stats: map[string]int64{"Duplicates": 2}},
		{method: "RetryScheduled", emit: func(e engine.Emitter) { e.RetryScheduled(tp, 12, 2, ErrorClassHandler, time.Second) },
			want:  RetryScheduled{Group: group, Topic: "orders", Partition: 3, Offset: 12, Attempt: 2, ErrorClass: ErrorClassHandler, Backoff: time.Second},
			stats: map[string]int64{"Retries": 1}},
		{method: "DeadLettered", emit: func(e engine.Emitter) { e.DeadLettered(tp, 12, 5, ErrorClassHandler) },
			want:  DeadLettered{Group: group, Topic: "orders", Partition: 3, Offset: 12, Attempts: 5, ErrorClass: ErrorClassHandler},
			stats: map[string]int64{"DeadLettered": 1}},
		{method: "Fenced", emit: func(e engine.Emitter) { e.Fenced(tp, 15, 30) },
			want:     Fenced{Group: group, Topic: "orders", Partition: 3, Expected: 15, Watermark: 30},
			noMetric: "a fence is a rebalance's race, logged and given to HookFenced; nothing to chart"},
		{method: "Reconciled", emit: func(e engine.Emitter) { e.Reconciled(tp, -4, 40, false) },
			want: PartitionReconciled{Group: group, Topic: "orders", Partition: 3, Drift: -4, Start: 40}},
		{method: "PartitionsAssigned", emit: func(e engine.Emitter) { e.PartitionsAssigned(pos) },
			want:     PartitionsAssigned{Group: group, Partitions: offs},
			noMetric: "the assignment is the Kafka client's to count (librdkafka's statistics)"},
		{method: "PartitionsRevoked", emit: func(e engine.Emitter) { e.PartitionsRevoked(pos, true) },
			want:     PartitionsRevoked{Group: group, Partitions: offs, Lost: true},
			noMetric: "the assignment is the Kafka client's to count (librdkafka's statistics)"},
		{method: "OffsetsSkipped", emit: func(e engine.Emitter) { e.OffsetsSkipped(tp, offsetstore.KindUnexplainedSkip, 40, 46) },
			want:  OffsetsSkipped{Group: group, Topic: "orders", Partition: 3, From: 40, To: 46, Kind: offsetstore.KindUnexplainedSkip},
			stats: map[string]int64{"SkippedOffsets": 6}},
		{method: "RollbackReplayed", emit: func(e engine.Emitter) { e.RollbackReplayed(tp, 20, 27) },
			want:  RollbackReplayed{Group: group, Topic: "orders", Partition: 3, From: 20, To: 27},
			stats: map[string]int64{"RolledBackOffsets": 7}},
		{method: "DependencyUnavailable", emit: func(e engine.Emitter) { e.DependencyUnavailable(tp, 12, since, 2*time.Second) },
			want:  DependencyUnavailable{Group: group, Topic: "orders", Partition: 3, Offset: 12, Since: since, Backoff: 2 * time.Second},
			stats: map[string]int64{"Unavailable": 1}},
		{method: "DependencyAvailable", emit: func(e engine.Emitter) { e.DependencyAvailable(tp, since) },
			want: DependencyAvailable{Group: group, Topic: "orders", Partition: 3, Since: since}},
		{method: "PartitionLag", emit: func(e engine.Emitter) { e.PartitionLag(tp, 40, 52) },
			want: PartitionLag{Group: group, Topic: "orders", Partition: 3, Watermark: 40, LogEnd: 52, Lag: 12}},
		{method: "PartitionPaused", emit: func(e engine.Emitter) { e.PartitionPaused(tp, 1<<20) },
			want:     PartitionPaused{Group: group, Topic: "orders", Partition: 3, Bytes: 1 << 20},
			stats:    map[string]int64{"Pauses": 1},
			noMetric: "a pause is counted in Stats.Pauses and given to HookPartitionPaused; kafkatx_partition_lag shows its effect"},
		{method: "BreakerChanged", emit: func(e engine.Emitter) { e.BreakerChanged(true, breaker) },
			want: BreakerChanged{Group: group, Open: true, Since: since, Signature: breaker.Signature, SQLState: "42501",
				Example: "permission denied", Messages: 3, Partitions: []string{"b[1]", "orders[3]"}},
			stats: map[string]int64{"BreakerOpens": 1}},
		{method: "BreakerChanged", emit: func(e engine.Emitter) { e.BreakerChanged(false, breaker) },
			want: BreakerChanged{Group: group, Since: since, Signature: breaker.Signature, SQLState: "42501",
				Example: "permission denied", Messages: 3, Partitions: []string{"b[1]", "orders[3]"}}},
		{method: "HandlerStuck", emit: func(e engine.Emitter) { e.HandlerStuck(tp, 12, since, true) },
			want: HandlerStuck{Group: group, Topic: "orders", Partition: 3, Offset: 12, Since: since, Stuck: true}},
		{method: "HandlerStuck", emit: func(e engine.Emitter) { e.HandlerStuck(tp, 12, since, false) },
			want: HandlerStuck{Group: group, Topic: "orders", Partition: 3, Offset: 12, Since: since}},
		{method: "PartitionStalled", emit: func(e engine.Emitter) { e.PartitionStalled(tp, 40, 52, true) },
			want: PartitionStalled{Group: group, Topic: "orders", Partition: 3, Watermark: 40, LogEnd: 52, Stalled: true}},
		{method: "PartitionStalled", emit: func(e engine.Emitter) { e.PartitionStalled(tp, 41, 52, false) },
			want: PartitionStalled{Group: group, Topic: "orders", Partition: 3, Watermark: 41, LogEnd: 52}},
		{method: "LogChanged", emit: func(e engine.Emitter) { e.LogChanged(tp, change, false) },
			want: LogChanged{Group: group, Topic: "orders", Partition: 3, RecordedTopicID: "t-old", TopicID: "t-new",
				RecordedClusterID: "c-old", ClusterID: "c-new"}},
		{method: "LogChanged", emit: func(e engine.Emitter) { e.LogChanged(tp, change, true) },
			want: LogChanged{Group: group, Topic: "orders", Partition: 3, RecordedTopicID: "t-old", TopicID: "t-new",
				RecordedClusterID: "c-old", ClusterID: "c-new", Adopted: true}},
	}

	// Every Emitter method has a row, and every row a method.
	covered := map[string]bool{}
	for _, c := range cases {
		covered[c.method] = true
	}
	et := reflect.TypeOf((*engine.Emitter)(nil)).Elem()
	for i := 0; i < et.NumMethod(); i++ {
		if m := et.Method(i).Name; !covered[m] {
			t.Errorf("engine.Emitter.%s has no row here: give it a public Hook* interface in hooks.go, the emitter's call in events.go, its Stats counter and metric (or why none), and a row", m)
		}
		delete(covered, et.Method(i).Name)
	}
	for m := range covered {
		t.Errorf("row %s is no method of engine.Emitter", m)
	}

	reg := prometheus.NewRegistry()
	prom, err := newPromHook(reg)
	if err != nil {
		t.Fatal(err)
	}
	user := &everyHook{}
	hooks, err := newHookSet([]Hook{prom}, []Hook{user})
	if err != nil {
		t.Fatal(err)
	}
	// Every Hook* interface is one the user's hook implements: it is in every list of the set.
	hv := reflect.ValueOf(hooks)
	for i := 0; i < hv.NumField(); i++ {
		l := hv.Field(i)
		if l.Len() == 0 || l.Index(l.Len()-1).Elem().Pointer() != reflect.ValueOf(user).Pointer() {
			t.Errorf("hookSet.%s does not hold the user's hook: everyHook misses a Hook* interface", hv.Type().Field(i).Name)
		}
	}
	var stats counters
	var e engine.Emitter = &emitter{group: group, log: zap.NewNop(), hooks: hooks, stats: &stats}
	for _, c := range cases {
		beforeStats, beforeMetrics := stats.load(), metricsText(t, reg)
		c.emit(e)
		if got := user.take(); len(got) != 1 || !reflect.DeepEqual(got[0], c.want) {
			t.Errorf("%s: users' hooks got %+v, want [%+v]", c.method, got, c.want)
		}
		after := stats.load()
		bv, av := reflect.ValueOf(beforeStats), reflect.ValueOf(after)
		for i := 0; i < av.NumField(); i++ {
			name := av.Type().Field(i).Name
			if av.Field(i).Kind() != reflect.Int64 {
				continue
			}
			if d := av.Field(i).Int() - bv.Field(i).Int(); d != c.stats[name] {
				t.Errorf("%s: Stats.%s moved by %d, want %d", c.method, name, d, c.stats[name])
			}
		}
		changed := metricsText(t, reg) != beforeMetrics
		switch {
		case c.noMetric == "" && !changed:
			t.Errorf("%s: the metrics did not change: kafkatx's Prometheus hook (metrics.go) misses the event's hook", c.method)
		case c.noMetric != "" && changed:
			t.Errorf("%s: the metrics changed although the row says none (%s)", c.method, c.noMetric)
		}
	}
}
