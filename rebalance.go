package kafkatx

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/offsetstore"
)

func (c *Consumer) rebalance(ctx context.Context, ev kafka.Event) error {
	c.eager = c.kc.GetRebalanceProtocol() == "EAGER"
	switch e := ev.(type) {
	case kafka.AssignedPartitions:
		return c.onAssigned(ctx, e.Partitions)
	case kafka.RevokedPartitions:
		return c.onRevoked(e.Partitions, c.kc.AssignmentLost())
	}
	return nil
}

// onAssigned reconciles each partition's database watermark W with Kafka's committed
// offset K (docs/design.md, "Offsets: the database leads, Kafka follows"), starts a worker per
// partition and assigns the partitions at the chosen start offsets.
func (c *Consumer) onAssigned(ctx context.Context, assigned []kafka.TopicPartition) error {
	if len(assigned) == 0 {
		c.joined()
		c.log.Info("rebalance: no partitions added", zap.Int("assigned_partitions", c.assignedCount()))
		if c.eager {
			return c.kc.Assign(assigned)
		}
		return c.kc.IncrementalAssign(assigned)
	}
	var starts []kafka.TopicPartition
	for attempt := 1; ; attempt++ {
		var err error
		starts, err = c.reconcile(ctx, assigned)
		if err == nil {
			break
		}
		var ahead *OffsetAheadError
		var outside *LogRangeError
		if errors.As(err, &ahead) || errors.As(err, &outside) || ctx.Err() != nil {
			c.fatal = err
			if ctx.Err() != nil {
				c.fatal = nil
			}
			return nil
		}
		d := c.cfg.Retry.Backoff(min(attempt, 8))
		c.log.Warn("reconcile assignment; retrying", zap.Error(err), zap.Duration("backoff", d))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(d):
		}
	}
	c.stats.firstAssigned.CompareAndSwap(0, time.Now().UnixNano())
	c.joined()
	c.log.Info("partitions assigned", zap.Strings("partitions", tpOffsets(starts)), zap.Int("assigned_partitions", c.assignedCount()))
	added := make([]PartitionOffset, len(starts))
	for i, s := range starts {
		added[i] = PartitionOffset{Topic: *s.Topic, Partition: s.Partition, Offset: int64(s.Offset)}
	}
	c.partitionsAssigned(added)
	if c.eager {
		// Eager protocols hand over the whole assignment each time.
		return c.kc.Assign(starts)
	}
	return c.kc.IncrementalAssign(starts)
}

func (c *Consumer) reconcile(ctx context.Context, assigned []kafka.TopicPartition) ([]kafka.TopicPartition, error) {
	tps := make([]offsetstore.TP, len(assigned))
	for i, a := range assigned {
		tps[i] = offsetstore.TP{Topic: *a.Topic, Partition: a.Partition}
	}
	ws, err := c.store.Watermarks(ctx, c.pool, c.group, tps)
	if err != nil {
		return nil, err
	}
	committed, err := c.kc.Committed(assigned, 10000)
	if err != nil {
		return nil, fmt.Errorf("read committed offsets: %w", err)
	}
	kOf, err := committedOf(committed)
	if err != nil {
		return nil, err
	}
	var starts []kafka.TopicPartition
	var newParts []*partition
	for _, tp := range tps {
		w, hasW := ws[tp]
		k, hasK := kOf[tp]
		log := c.log.With(zap.String("topic", tp.Topic), zap.Int32("partition", tp.Partition))
		low, high, err := c.kc.QueryWatermarkOffsets(tp.Topic, tp.Partition, 10000)
		if err != nil {
			return nil, fmt.Errorf("query log offsets of %s: %w", tp, err)
		}
		d := decideStart(assignedOffsets{W: w.Next, HasW: hasW, K: k, HasK: hasK, LogStart: low, LogEnd: high,
			StartAtEnd: c.startsAtEnd(), OnAhead: c.cfg.OnKafkaAhead})
		w, err = c.applyStart(ctx, tp, w, k, low, high, d, log)
		if err != nil {
			return nil, err
		}
		start := d.Start
		atts, err := c.store.Attempts(ctx, c.pool, c.group, tp, w.Next)
		if err != nil {
			return nil, err
		}
		p := newPartition(c, tp, w, atts)
		newParts = append(newParts, p)
		topic := tp.Topic
		starts = append(starts, kafka.TopicPartition{Topic: &topic, Partition: tp.Partition, Offset: kafka.Offset(start)})
	}
	c.mu.Lock()
	for _, p := range newParts {
		if old := c.parts[p.tp]; old != nil { // eager re-assignment of a partition we still run
			c.mu.Unlock()
			old.stopAndWait(false)
			c.mu.Lock()
		}
		c.parts[p.tp] = p
		go p.run()
	}
	c.mu.Unlock()
	return starts, nil
}

// committedOf maps Kafka's answer to a committed-offsets read to each partition's committed
// offset; a partition without one (never committed, expired or deleted: a negative offset) is
// absent. A partition answered with an error makes the whole read fail, and the assignment is
// reconciled again after a backoff: under group.protocol=consumer (KIP-848) the offset fetch is
// refused with STALE_MEMBER_EPOCH or UNKNOWN_MEMBER_ID while the member's epoch moves, and taken
// as "no committed offset" such an answer would start a partition kafkatx has never seen at
// auto.offset.reset instead of at Kafka's offset, and audit a watermarked one as Kafka missing.
func committedOf(res []kafka.TopicPartition) (map[offsetstore.TP]int64, error) {
	out := map[offsetstore.TP]int64{}
	for _, k := range res {
		tp := offsetstore.TP{Topic: *k.Topic, Partition: k.Partition}
		if k.Error != nil {
			return nil, fmt.Errorf("read committed offset of %s: %w", tp, k.Error)
		}
		if k.Offset >= 0 {
			out[tp] = int64(k.Offset)
		}
	}
	return out, nil
}

// applyStart carries out decision d for partition tp, whose stored watermark is w, Kafka's
// committed offset k and log range [low, high): the audit rows, logs, metrics, watermark moves
// and Kafka commits that docs/offsets.md lists for d's case. It returns the watermark the
// worker starts from, or the error that halts the consumer (*LogRangeError,
// *OffsetAheadError) or makes the caller retry.
func (c *Consumer) applyStart(ctx context.Context, tp offsetstore.TP, w offsetstore.Watermark, k, low, high int64,
	d startDecision, log *zap.Logger) (offsetstore.Watermark, error) {
	audit := func(kind string, from, to int64, reason string) error {
		_, err := c.store.InsertEvent(ctx, c.pool, offsetstore.Event{Group: c.group, Topic: tp.Topic, Partition: tp.Partition,
			Kind: kind, From: from, To: to, Actor: "kafkatx.consumer", Reason: reason})
		return err
	}
	if d.IgnoreK {
		log.Error("Kafka committed offset is past the log end; ignoring it", zap.Int64("committed", k), zap.Int64("log_end", high))
		if err := audit(offsetstore.KindKafkaOutOfRange, k, k, fmt.Sprintf("committed offset %d past the log end %d; ignored", k, high)); err != nil {
			return w, err
		}
	}
	if d.Case == caseWatermarkPastLogEnd {
		e := &LogRangeError{Group: c.group, Topic: tp.Topic, Partition: tp.Partition, Watermark: w.Next, LogStart: low, LogEnd: high}
		log.Error("database watermark past the log end; halting", zap.Int64("watermark", w.Next), zap.Int64("log_end", high))
		_ = audit(offsetstore.KindHalt, high, w.Next, e.Error())
		return w, e
	}
	if d.RetentionFrom >= 0 {
		log.Error("records removed from the log before they were processed; following the log start",
			zap.Int64("watermark", w.Next), zap.Int64("log_start", low), zap.Int64("lost", low-w.Next))
		if _, err := c.follow(ctx, tp, w.Next, low, fmt.Sprintf("log start %d passed the watermark %d: records removed by retention or delete-records before they were processed", low, w.Next)); err != nil {
			return w, err
		}
		c.offsetsSkipped(tp, offsetstore.KindUnexplainedSkip, w.Next, low)
		w.Next, w.InflightEnd = low, -1
	}
	switch d.Case {
	case caseFirstRun:
		hasK := !d.Commit
		nw, err := c.firstRun(ctx, tp, d.Start, hasK)
		if err != nil {
			return w, err
		}
		if nw.Next != d.Start { // another member recorded it first; compare again next time
			return w, fmt.Errorf("watermark of %s appeared concurrently", tp)
		}
		log.Info("first run on partition", zap.Int64("offset", d.Start), zap.Bool("kafka_committed", hasK))
		w = nw
	case caseKafkaMissing:
		log.Warn("no committed offset in Kafka; starting at the database watermark and re-committing it", zap.Int64("watermark", w.Next))
		if err := audit(offsetstore.KindKafkaMissing, w.Next, w.Next, "no committed offset in Kafka (expired or deleted); database leads"); err != nil {
			return w, err
		}
	case caseAligned, caseBehindAfterRetention:
	case caseKafkaBehind:
		log.Warn("Kafka committed offset behind the database watermark; starting at the watermark and re-committing it",
			zap.Int64("committed", k), zap.Int64("watermark", w.Next))
		if err := audit(offsetstore.KindKafkaBehind, k, w.Next, "Kafka commit lost or rewound; database leads"); err != nil {
			return w, err
		}
	case caseAheadHalt:
		e := &OffsetAheadError{Group: c.group, Topic: tp.Topic, Partition: tp.Partition, Watermark: w.Next, Committed: k}
		log.Error("Kafka committed offset ahead of the database watermark; halting", zap.Int64("committed", k), zap.Int64("watermark", w.Next))
		_ = audit(offsetstore.KindHalt, w.Next, k, "Kafka ahead of the database; policy halt")
		c.reconciled(tp, d.Drift, d.Start, true)
		return w, e
	case caseAheadFollow:
		kind, err := c.follow(ctx, tp, w.Next, k, "Kafka committed offset ahead of the database watermark with no kafkatx command on record")
		if err != nil {
			return w, err
		}
		if kind == offsetstore.KindUnexplainedSkip {
			log.Error("Kafka committed offset ahead of the database watermark with no kafkatx command on record: following Kafka, offsets skipped unexplained",
				zap.Int64("from", w.Next), zap.Int64("to", k), zap.Int64("skipped", k-w.Next))
		} else {
			log.Warn("following an operator skip", zap.Int64("from", w.Next), zap.Int64("to", k))
		}
		c.offsetsSkipped(tp, kind, w.Next, k)
		w.Next, w.InflightEnd = k, -1
	}
	if d.Commit {
		c.commits.enqueue(tp, d.Start)
	}
	c.reconciled(tp, d.Drift, d.Start, false)
	return w, nil
}

// firstRun records a partition's first watermark at start and its first_run audit row in
// one transaction, and returns the stored row (another member's, if it was first).
func (c *Consumer) firstRun(ctx context.Context, tp offsetstore.TP, start int64, hasK bool) (offsetstore.Watermark, error) {
	tx, err := c.begin(ctx)
	if err != nil {
		return offsetstore.Watermark{}, fmt.Errorf("record first watermark %s: %w", tp, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	w, created, err := c.store.Init(ctx, tx, c.group, tp, start)
	if err != nil {
		return offsetstore.Watermark{}, err
	}
	if created {
		if _, err := c.store.InsertEvent(ctx, tx, offsetstore.Event{Group: c.group, Topic: tp.Topic, Partition: tp.Partition,
			Kind: offsetstore.KindFirstRun, From: start, To: start, Actor: "kafkatx.consumer", Reason: "no watermark; started at " + startSource(hasK)}); err != nil {
			return offsetstore.Watermark{}, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return offsetstore.Watermark{}, fmt.Errorf("record first watermark %s: %w", tp, err)
	}
	return w, nil
}

func startSource(hasK bool) string {
	if hasK {
		return "Kafka's committed offset"
	}
	return "auto.offset.reset"
}

// follow moves the watermark from w to k and records why in the same transaction: as the
// operator skip a kafkatx command left pending for exactly [w, k), else as an unexplained
// skip with reason.
func (c *Consumer) follow(ctx context.Context, tp offsetstore.TP, w, k int64, reason string) (string, error) {
	tx, err := c.begin(ctx)
	if err != nil {
		return "", fmt.Errorf("follow Kafka on %s: %w", tp, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	kind := offsetstore.KindUnexplainedSkip
	id, err := c.store.PendingSkip(ctx, tx, c.group, tp, w, k)
	if err != nil {
		return "", err
	}
	if id != 0 {
		kind = offsetstore.KindOperatorSkip
		if err := c.store.SetEventStatus(ctx, tx, id, "applied"); err != nil {
			return "", err
		}
	} else if _, err := c.store.InsertEvent(ctx, tx, offsetstore.Event{Group: c.group, Topic: tp.Topic, Partition: tp.Partition,
		Kind: kind, From: w, To: k, Actor: "kafkatx.consumer", Reason: reason}); err != nil {
		return "", err
	}
	if err := c.store.Advance(ctx, tx, c.group, tp, w, k, -1); err != nil {
		return "", err
	}
	if err := c.store.DeleteAttempts(ctx, tx, c.group, tp, w, k); err != nil {
		return "", err
	}
	if err := tx.Commit(ctx); err != nil {
		return "", fmt.Errorf("follow Kafka on %s: %w", tp, err)
	}
	return kind, nil
}

// startsAtEnd reports whether the user's auto.offset.reset starts new partitions at the log
// end (latest) rather than the start (earliest, the default: nothing is lost).
func (c *Consumer) startsAtEnd() bool {
	switch c.cfg.startAt {
	case "latest", "largest", "end":
		return true
	}
	return false
}

// onRevoked stops the revoked partitions' workers (their in-flight transactions finish,
// or abort when the partitions were lost), commits their final watermarks unless lost, and
// unassigns them.
func (c *Consumer) onRevoked(revoked []kafka.TopicPartition, lost bool) error {
	only := map[offsetstore.TP]bool{}
	var ps []*partition
	c.mu.Lock()
	for _, r := range revoked {
		tp := offsetstore.TP{Topic: *r.Topic, Partition: r.Partition}
		only[tp] = true
		if p := c.parts[tp]; p != nil {
			ps = append(ps, p)
		}
	}
	c.mu.Unlock()
	c.stopPartitions(ps, lost)
	defer c.partitionsRevoked(ps, lost)
	if lost {
		c.commits.drop(only)
		c.health.set(func(h *health) { h.joined = false })
		c.log.Warn("partitions lost (the group moved on without this member); in-flight transactions aborted",
			zap.Strings("partitions", finalOffsets(ps)))
	} else {
		_ = c.commits.flush(only)
		c.commits.drop(only) // a commit still refused now must not land after the new owner's
		if len(ps) > 0 {
			c.log.Info("partitions revoked", zap.Strings("partitions", finalOffsets(ps)))
		}
	}
	c.mu.Lock()
	for tp := range only {
		delete(c.parts, tp)
	}
	c.mu.Unlock()
	if c.kc.IsClosed() {
		return nil
	}
	if c.eager {
		return c.kc.Unassign()
	}
	return c.kc.IncrementalUnassign(revoked)
}

// joined records that the member holds an assignment (possibly empty) from the group, and
// clears a group or cluster authorization failure.
func (c *Consumer) joined() {
	c.health.set(func(h *health) {
		h.joined = true
		if h.authErr != "" && hasCode(authorizationCodes, h.authCode) {
			h.authErr, h.authSince = "", time.Time{}
		}
	})
}

func (c *Consumer) assignedCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.parts)
}

// revokeAll stops every worker and commits their watermarks (used on shutdown).
func (c *Consumer) revokeAll(lost bool) {
	c.mu.Lock()
	ps := make([]*partition, 0, len(c.parts))
	for _, p := range c.parts {
		ps = append(ps, p)
	}
	c.mu.Unlock()
	c.stopPartitions(ps, lost)
	_ = c.commits.flush(nil)
	c.mu.Lock()
	c.parts = map[offsetstore.TP]*partition{}
	c.mu.Unlock()
	if len(ps) > 0 {
		c.log.Info("partitions revoked", zap.Strings("partitions", finalOffsets(ps)), zap.String("why", "consumer stopping"))
	}
	c.partitionsRevoked(ps, lost)
}

// finalOffsets names stopped partitions with their watermarks, "topic[partition]@offset".
func finalOffsets(ps []*partition) []string {
	tps := make([]kafka.TopicPartition, len(ps))
	for i, p := range ps {
		tps[i] = p.ktp()
		tps[i].Offset = kafka.Offset(p.watermark.Load())
	}
	return tpOffsets(tps)
}

func (c *Consumer) stopPartitions(ps []*partition, lost bool) {
	for _, p := range ps {
		p.requestStop(lost)
	}
	for _, p := range ps {
		p.wait()
	}
}
