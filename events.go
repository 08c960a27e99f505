package kafkatx

import (
	"fmt"
	"sort"
	"time"

	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/engine"
	"github.com/kafkatx/kafkatx/internal/offsetstate"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
)

// The one place where the loop records what happened: the engine's Emitter. Each event moves
// its Stats counter and calls the hooks that want it (Config.Hooks, after kafkatx's own
// Prometheus hook in metrics.go), so Stats, the metrics and users' hooks never disagree: the
// metrics see an event only through its public hook. A new event is a method here, on
// engine.Emitter, and an interface in hooks.go (TestEveryEventReachesHooksStatsAndMetrics
// fails on an Emitter method that reaches no hook); a new metric for an event is a change to
// metrics.go alone.
type emitter struct {
	group string
	log   *zap.Logger
	hooks hookSet
	stats *counters
}

// callHooks calls call for each hook of hs, recovering (and logging) a hook's panic so that
// it never reaches the loop.
func callHooks[H any](e *emitter, hs []H, call func(H)) {
	for _, h := range hs {
		func() {
			defer func() {
				if r := recover(); r != nil {
					e.log.Error("hook panicked; ignored, the loop goes on", zap.String("hook", fmt.Sprintf("%T", h)), zap.String("panic", fmt.Sprint(r)))
				}
			}()
			call(h)
		}()
	}
}

func (e *emitter) BatchCommitted(tp offsetstore.TP, first, next int64, t engine.Tried, d time.Duration) {
	e.stats.processed.Add(int64(t.Fresh))
	e.stats.duplicates.Add(int64(len(t.Dups)))
	e.stats.notChanges.Add(int64(len(t.NotChanges)))
	ev := BatchCommitted{Group: e.group, Topic: tp.Topic, Partition: tp.Partition, FirstOffset: first, NextOffset: next,
		Processed: t.Fresh, Duplicates: len(t.Dups), NotChanges: len(t.NotChanges), Duration: d}
	callHooks(e, e.hooks.batchCommitted, func(h HookBatchCommitted) { h.OnBatchCommitted(ev) })
}

func (e *emitter) RedeliveryDropped(tp offsetstore.TP, n int) {
	if n <= 0 {
		return
	}
	e.stats.duplicates.Add(int64(n))
	ev := RedeliveryDropped{Group: e.group, Topic: tp.Topic, Partition: tp.Partition, Count: n}
	callHooks(e, e.hooks.redelivery, func(h HookRedeliveryDropped) { h.OnRedeliveryDropped(ev) })
}

func (e *emitter) RetryScheduled(tp offsetstore.TP, offset int64, attempt int, class string, backoff time.Duration) {
	e.stats.retries.Add(1)
	ev := RetryScheduled{Group: e.group, Topic: tp.Topic, Partition: tp.Partition, Offset: offset, Attempt: attempt, ErrorClass: class, Backoff: backoff}
	callHooks(e, e.hooks.retry, func(h HookRetryScheduled) { h.OnRetryScheduled(ev) })
}

func (e *emitter) DeadLettered(tp offsetstore.TP, offset int64, attempts int, class string) {
	e.stats.deadLettered.Add(1)
	ev := DeadLettered{Group: e.group, Topic: tp.Topic, Partition: tp.Partition, Offset: offset, Attempts: attempts, ErrorClass: class}
	callHooks(e, e.hooks.deadLettered, func(h HookDeadLettered) { h.OnDeadLettered(ev) })
}

func (e *emitter) Fenced(tp offsetstore.TP, expected, w int64) {
	ev := Fenced{Group: e.group, Topic: tp.Topic, Partition: tp.Partition, Expected: expected, Watermark: w}
	callHooks(e, e.hooks.fenced, func(h HookFenced) { h.OnFenced(ev) })
}

func (e *emitter) Reconciled(tp offsetstore.TP, drift, start int64, halted bool) {
	ev := PartitionReconciled{Group: e.group, Topic: tp.Topic, Partition: tp.Partition, Drift: drift, Start: start, Halted: halted}
	callHooks(e, e.hooks.reconciled, func(h HookPartitionReconciled) { h.OnPartitionReconciled(ev) })
}

func (e *emitter) PartitionsAssigned(starts []engine.Position) {
	if len(starts) == 0 || len(e.hooks.assigned) == 0 {
		return
	}
	ev := PartitionsAssigned{Group: e.group, Partitions: partitionOffsets(starts)}
	callHooks(e, e.hooks.assigned, func(h HookPartitionsAssigned) { h.OnPartitionsAssigned(ev) })
}

func (e *emitter) PartitionsRevoked(final []engine.Position, lost bool) {
	if len(final) == 0 || len(e.hooks.revoked) == 0 {
		return
	}
	ev := PartitionsRevoked{Group: e.group, Lost: lost, Partitions: partitionOffsets(final)}
	callHooks(e, e.hooks.revoked, func(h HookPartitionsRevoked) { h.OnPartitionsRevoked(ev) })
}

func partitionOffsets(ps []engine.Position) []PartitionOffset {
	out := make([]PartitionOffset, len(ps))
	for i, p := range ps {
		out[i] = PartitionOffset{Topic: p.Topic, Partition: p.Partition, Offset: p.Offset}
	}
	return out
}

func (e *emitter) OffsetsSkipped(tp offsetstore.TP, kind string, from, to int64) {
	if to <= from {
		return
	}
	e.stats.skipped.Add(to - from)
	ev := OffsetsSkipped{Group: e.group, Topic: tp.Topic, Partition: tp.Partition, From: from, To: to, Kind: kind}
	callHooks(e, e.hooks.skipped, func(h HookOffsetsSkipped) { h.OnOffsetsSkipped(ev) })
}

func (e *emitter) RollbackReplayed(tp offsetstore.TP, from, to int64) {
	if to <= from {
		return
	}
	e.stats.rolledBack.Add(to - from)
	ev := RollbackReplayed{Group: e.group, Topic: tp.Topic, Partition: tp.Partition, From: from, To: to}
	callHooks(e, e.hooks.rolledBack, func(h HookRollbackReplayed) { h.OnRollbackReplayed(ev) })
}

func (e *emitter) DependencyUnavailable(tp offsetstore.TP, offset int64, since time.Time, backoff time.Duration) {
	e.stats.unavailable.Add(1)
	ev := DependencyUnavailable{Group: e.group, Topic: tp.Topic, Partition: tp.Partition, Offset: offset, Since: since, Backoff: backoff}
	callHooks(e, e.hooks.unavailable, func(h HookDependencyUnavailable) { h.OnDependencyUnavailable(ev) })
}

func (e *emitter) DependencyAvailable(tp offsetstore.TP, since time.Time) {
	ev := DependencyAvailable{Group: e.group, Topic: tp.Topic, Partition: tp.Partition, Since: since}
	callHooks(e, e.hooks.available, func(h HookDependencyAvailable) { h.OnDependencyAvailable(ev) })
}

func (e *emitter) PartitionLag(tp offsetstore.TP, w, high int64) {
	ev := PartitionLag{Group: e.group, Topic: tp.Topic, Partition: tp.Partition, Watermark: w, LogEnd: high, Lag: high - w}
	callHooks(e, e.hooks.lag, func(h HookPartitionLag) { h.OnPartitionLag(ev) })
}

func (e *emitter) BreakerChanged(open bool, s engine.BreakerState) {
	if open {
		e.stats.breakerOpens.Add(1)
	}
	ev := BreakerChanged{Group: e.group, Open: open, Since: s.Since, Signature: s.Signature, SQLState: s.SQLState,
		Example: s.Example, Messages: s.Messages}
	for _, tp := range s.Held {
		ev.Partitions = append(ev.Partitions, tp.String())
	}
	sort.Strings(ev.Partitions)
	callHooks(e, e.hooks.breaker, func(h HookBreakerChanged) { h.OnBreakerChanged(ev) })
}

func (e *emitter) HandlerStuck(tp offsetstore.TP, offset int64, since time.Time, stuck bool) {
	ev := HandlerStuck{Group: e.group, Topic: tp.Topic, Partition: tp.Partition, Offset: offset, Since: since, Stuck: stuck}
	callHooks(e, e.hooks.stuck, func(h HookHandlerStuck) { h.OnHandlerStuck(ev) })
}

func (e *emitter) PartitionStalled(tp offsetstore.TP, watermark, logEnd int64, stalled bool) {
	ev := PartitionStalled{Group: e.group, Topic: tp.Topic, Partition: tp.Partition, Watermark: watermark, LogEnd: logEnd, Stalled: stalled}
	callHooks(e, e.hooks.stalled, func(h HookPartitionStalled) { h.OnPartitionStalled(ev) })
}

func (e *emitter) PartitionPaused(tp offsetstore.TP, bytes int64) {
	e.stats.pauses.Add(1)
	ev := PartitionPaused{Group: e.group, Topic: tp.Topic, Partition: tp.Partition, Bytes: bytes}
	callHooks(e, e.hooks.paused, func(h HookPartitionPaused) { h.OnPartitionPaused(ev) })
}

func (e *emitter) LogChanged(tp offsetstore.TP, c offsetstate.LogChange, adopted bool) {
	ev := LogChanged{Group: e.group, Topic: tp.Topic, Partition: tp.Partition,
		RecordedTopicID: c.Recorded.Topic, TopicID: c.Current.Topic, RecordedClusterID: c.Recorded.Cluster, ClusterID: c.Current.Cluster,
		Adopted: adopted}
	callHooks(e, e.hooks.logChanged, func(h HookLogChanged) { h.OnLogChanged(ev) })
}
