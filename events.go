package kafkatx

import (
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/offsetstore"
)

// The one place where the loop records what happened: each event moves its Stats counter and
// calls the hooks that want it (Config.Hooks, after kafkatx's own Prometheus hook in
// metrics.go), so Stats, the metrics and users' hooks never disagree. A new event is a
// function here and an interface in hooks.go; a new metric for an event is a change to
// metrics.go alone.

// callHooks calls call for each hook of hs, recovering (and logging) a hook's panic so that
// it never reaches the loop.
func callHooks[H any](c *Consumer, hs []H, call func(H)) {
	for _, h := range hs {
		callHook(c, h, call)
	}
}

func callHook[H any](c *Consumer, h H, call func(H)) {
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("hook panicked; ignored, the loop goes on", zap.String("hook", fmt.Sprintf("%T", h)), zap.String("panic", fmt.Sprint(r)))
		}
	}()
	call(h)
}

// batchCommitted records a committed transaction of p that ran the handler (see
// BatchCommitted).
func (c *Consumer) batchCommitted(p *partition, first, next int64, cl claimed, d time.Duration) {
	c.stats.processed.Add(int64(len(cl.fresh)))
	c.stats.duplicates.Add(int64(cl.dups))
	c.stats.notChanges.Add(int64(cl.notChanges))
	ev := BatchCommitted{Group: c.group, Topic: p.tp.Topic, Partition: p.tp.Partition, FirstOffset: first, NextOffset: next,
		Processed: len(cl.fresh), Duplicates: cl.dups, NotChanges: cl.notChanges, Duration: d}
	callHooks(c, c.hooks.batchCommitted, func(h HookBatchCommitted) { h.OnBatchCommitted(ev) })
}

// redeliveryDropped records n messages of tp dropped because they were below the watermark.
func (c *Consumer) redeliveryDropped(tp offsetstore.TP, n int) {
	if n <= 0 {
		return
	}
	c.stats.duplicates.Add(int64(n))
	ev := RedeliveryDropped{Group: c.group, Topic: tp.Topic, Partition: tp.Partition, Count: n}
	callHooks(c, c.hooks.redelivery, func(h HookRedeliveryDropped) { h.OnRedeliveryDropped(ev) })
}

// retryScheduled records that offset of p, after attempt failed tries (the last of class),
// is tried again after backoff.
func (c *Consumer) retryScheduled(p *partition, offset int64, attempt int, class string, backoff time.Duration) {
	c.stats.retries.Add(1)
	ev := RetryScheduled{Group: c.group, Topic: p.tp.Topic, Partition: p.tp.Partition, Offset: offset, Attempt: attempt, ErrorClass: class, Backoff: backoff}
	callHooks(c, c.hooks.retry, func(h HookRetryScheduled) { h.OnRetryScheduled(ev) })
}

// deadLettered records a committed dead letter of p.
func (c *Consumer) deadLettered(p *partition, offset int64, attempts int, class string) {
	c.stats.deadLettered.Add(1)
	ev := DeadLettered{Group: c.group, Topic: p.tp.Topic, Partition: p.tp.Partition, Offset: offset, Attempts: attempts, ErrorClass: class}
	callHooks(c, c.hooks.deadLettered, func(h HookDeadLettered) { h.OnDeadLettered(ev) })
}

// fenced records a fenced watermark update of p: it held expected, the database has w.
func (c *Consumer) fenced(p *partition, expected, w int64) {
	ev := Fenced{Group: c.group, Topic: p.tp.Topic, Partition: p.tp.Partition, Expected: expected, Watermark: w}
	callHooks(c, c.hooks.fenced, func(h HookFenced) { h.OnFenced(ev) })
}

// reconciled records the reconciliation of tp on assignment.
func (c *Consumer) reconciled(tp offsetstore.TP, drift, start int64, halted bool) {
	ev := PartitionReconciled{Group: c.group, Topic: tp.Topic, Partition: tp.Partition, Drift: drift, Start: start, Halted: halted}
	callHooks(c, c.hooks.reconciled, func(h HookPartitionReconciled) { h.OnPartitionReconciled(ev) })
}

// partitionsAssigned records partitions added to this member at their start offsets.
func (c *Consumer) partitionsAssigned(starts []PartitionOffset) {
	if len(starts) == 0 || len(c.hooks.assigned) == 0 {
		return
	}
	ev := PartitionsAssigned{Group: c.group, Partitions: starts}
	callHooks(c, c.hooks.assigned, func(h HookPartitionsAssigned) { h.OnPartitionsAssigned(ev) })
}

// partitionsRevoked records stopped workers ps, with their final watermarks.
func (c *Consumer) partitionsRevoked(ps []*partition, lost bool) {
	if len(ps) == 0 || len(c.hooks.revoked) == 0 {
		return
	}
	ev := PartitionsRevoked{Group: c.group, Lost: lost, Partitions: make([]PartitionOffset, len(ps))}
	for i, p := range ps {
		ev.Partitions[i] = PartitionOffset{Topic: p.tp.Topic, Partition: p.tp.Partition, Offset: p.watermark.Load()}
	}
	callHooks(c, c.hooks.revoked, func(h HookPartitionsRevoked) { h.OnPartitionsRevoked(ev) })
}

// offsetsSkipped records offsets [from, to) of tp skipped with an audit row of the given kind
// (offsetstore.KindOperatorSkip or KindUnexplainedSkip).
func (c *Consumer) offsetsSkipped(tp offsetstore.TP, kind string, from, to int64) {
	if to <= from {
		return
	}
	c.stats.skipped.Add(to - from)
	ev := OffsetsSkipped{Group: c.group, Topic: tp.Topic, Partition: tp.Partition, From: from, To: to, Kind: kind}
	callHooks(c, c.hooks.skipped, func(h HookOffsetsSkipped) { h.OnOffsetsSkipped(ev) })
}

// dependencyUnavailable records an Unavailable answer for offset of p, waited out.
func (c *Consumer) dependencyUnavailable(p *partition, offset int64, since time.Time, backoff time.Duration) {
	c.stats.unavailable.Add(1)
	ev := DependencyUnavailable{Group: c.group, Topic: p.tp.Topic, Partition: p.tp.Partition, Offset: offset, Since: since, Backoff: backoff}
	callHooks(c, c.hooks.unavailable, func(h HookDependencyUnavailable) { h.OnDependencyUnavailable(ev) })
}

// dependencyAvailable records the end of p's wait that began at since.
func (c *Consumer) dependencyAvailable(p *partition, since time.Time) {
	ev := DependencyAvailable{Group: c.group, Topic: p.tp.Topic, Partition: p.tp.Partition, Since: since}
	callHooks(c, c.hooks.available, func(h HookDependencyAvailable) { h.OnDependencyAvailable(ev) })
}

// partitionLag records tp's log end high against its watermark w.
func (c *Consumer) partitionLag(tp offsetstore.TP, w, high int64) {
	ev := PartitionLag{Group: c.group, Topic: tp.Topic, Partition: tp.Partition, Watermark: w, LogEnd: high, Lag: high - w}
	callHooks(c, c.hooks.lag, func(h HookPartitionLag) { h.OnPartitionLag(ev) })
}

// partitionPaused records a partition that stopped fetching over its MaxBufferedBytes share.
func (c *Consumer) partitionPaused(p *partition) {
	c.stats.pauses.Add(1)
	ev := PartitionPaused{Group: c.group, Topic: p.tp.Topic, Partition: p.tp.Partition, Bytes: p.bytes.Load()}
	callHooks(c, c.hooks.paused, func(h HookPartitionPaused) { h.OnPartitionPaused(ev) })
}
