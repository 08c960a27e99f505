package engine

import (
	"context"
	"errors"
	"fmt"
	"github.com/kafkatx/kafkatx/internal/msgfmt"
	"sync"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/offsetstate"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
)

func (l *Loop) rebalance(ctx context.Context, ev kafka.Event) error {
	l.eager = l.kc.GetRebalanceProtocol() == "EAGER"
	switch e := ev.(type) {
	case kafka.AssignedPartitions:
		return l.onAssigned(ctx, e.Partitions)
	case kafka.RevokedPartitions:
		return l.onRevoked(e.Partitions, l.kc.AssignmentLost())
	}
	return nil
}

// onAssigned reconciles each partition's database watermark W with Kafka's committed
// offset K (docs/design.md, "Offsets: the database leads, Kafka follows"), starts a worker per
// partition and assigns the partitions at the chosen start offsets.
func (l *Loop) onAssigned(ctx context.Context, assigned []kafka.TopicPartition) error {
	if len(assigned) == 0 {
		l.joined()
		l.log.Info("rebalance: no partitions added", zap.Int("assigned_partitions", l.assignedCount()))
		if l.eager {
			return l.kc.Assign(assigned)
		}
		return l.kc.IncrementalAssign(assigned)
	}
	var starts []kafka.TopicPartition
	for attempt := 1; ; attempt++ {
		var err error
		starts, err = l.reconcile(ctx, assigned)
		if err == nil {
			break
		}
		var h *halted
		if errors.As(err, &h) || ctx.Err() != nil {
			l.fatal = nil
			if h != nil && ctx.Err() == nil {
				l.fatal = h.err
			}
			return nil
		}
		d := l.set.Backoff(min(attempt, 8))
		l.log.Warn("reconcile assignment; retrying", zap.Error(err), zap.Duration("backoff", d))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(d):
		}
	}
	l.firstAssigned.CompareAndSwap(0, time.Now().UnixNano())
	l.joined()
	l.log.Info("partitions assigned", zap.Strings("partitions", tpOffsets(starts)), zap.Int("assigned_partitions", l.assignedCount()))
	added := make([]Position, len(starts))
	for i, s := range starts {
		added[i] = Position{TP: offsetstore.TP{Topic: *s.Topic, Partition: s.Partition}, Offset: int64(s.Offset)}
	}
	l.emit.PartitionsAssigned(added)
	defer l.resumeAssigned(starts) // stall.go
	if l.eager {
		// Eager protocols hand over the whole assignment each time.
		return l.kc.Assign(starts)
	}
	return l.kc.IncrementalAssign(starts)
}

func (l *Loop) reconcile(ctx context.Context, assigned []kafka.TopicPartition) ([]kafka.TopicPartition, error) {
	tps := make([]offsetstore.TP, len(assigned))
	for i, a := range assigned {
		tps[i] = offsetstore.TP{Topic: *a.Topic, Partition: a.Partition}
	}
	order, byShard, err := l.place(ctx, tps)
	if err != nil {
		return nil, err
	}
	ws := map[offsetstore.TP]offsetstore.Watermark{}
	for _, s := range order {
		sw, err := l.store.Watermarks(ctx, s.pool, l.group, byShard[s])
		if err != nil {
			return nil, err
		}
		for tp, w := range sw {
			ws[tp] = w
		}
	}
	committed, err := l.kc.Committed(assigned, 10000)
	if err != nil {
		return nil, fmt.Errorf("read committed offsets: %w", err)
	}
	kOf, err := committedOf(committed)
	if err != nil {
		return nil, err
	}
	ids, err := l.logIDs(ctx, l.kc, tps)
	if err != nil {
		return nil, err
	}
	// Topics the group read before this assignment: a partition of one without a watermark
	// was added to it (a partition count raised), which its first_run row says.
	l.knownTopics = map[string]bool{}
	for _, s := range l.allShards() {
		known, err := l.store.Topics(ctx, s.pool, l.group)
		if err != nil {
			return nil, err
		}
		for t := range known {
			l.knownTopics[t] = true
		}
	}
	marks := marksOf(committed)
	dbs := map[*shard]offsetstate.Database{}
	for _, s := range order {
		if dbs[s], err = l.readDatabase(ctx, s); err != nil {
			return nil, err
		}
	}
	var starts []kafka.TopicPartition
	var newParts []*worker
	for _, tp := range tps {
		w, hasW := ws[tp]
		k, hasK := kOf[tp]
		log := l.log.With(zap.String("topic", tp.Topic), zap.Int32("partition", tp.Partition))
		low, high, err := l.kc.QueryWatermarkOffsets(tp.Topic, tp.Partition, 10000)
		if err != nil {
			return nil, fmt.Errorf("query log offsets of %s: %w", tp, err)
		}
		var start int64
		change := offsetstate.CompareLog(offsetstate.LogID{Cluster: w.ClusterID, Topic: w.TopicID}, ids[tp.Topic])
		// The log the worker reads: as recorded, filled, or adopted below.
		l.mu.Lock()
		l.recordedLog[tp] = ids[tp.Topic]
		l.mu.Unlock()
		if hasW && change.Changed() { // another log: checked before the offsets are compared (identity.go)
			if w, err = l.onLogChange(ctx, tp, w, low, high, change, log); err != nil {
				return nil, err
			}
			start = w.Next
		} else {
			mark, marked := marks[tp]
			here, err := l.store.MarkedHere(ctx, l.poolOf(tp), l.group, tp, mark, marked, dbs[l.shardOf(tp)], w.Next, hasW, k, hasK)
			if err != nil {
				return nil, err
			}
			d := offsetstate.Classify(offsetstate.Offsets{W: w.Next, HasW: hasW, K: k, HasK: hasK, LogStart: low, LogEnd: high, KMarkedHere: here},
				offsetstate.Policy{StartAtEnd: l.set.StartAtEnd, HaltOnAhead: l.set.HaltOnAhead})
			if d.Compared == offsetstate.DatabaseRolledBack { // audited before Kafka goes back to W (rollback.go)
				if err := l.replayRollback(ctx, tp, d.W, k, mark, log.With(zap.String("state", string(d.State)))); err != nil {
					return nil, err
				}
			}
			w, err = l.applyStart(ctx, tp, w, k, low, high, d, log.With(zap.String("state", string(d.State))))
			if err != nil {
				return nil, err
			}
			start = d.Start
			if change.Missing() { // a first run, or a row older than the ids: filled on first contact
				if err := l.store.FillLogIdentity(ctx, l.poolOf(tp), l.group, tp, change.Current.Topic, change.Current.Cluster); err != nil {
					return nil, err
				}
				if w.TopicID == "" {
					w.TopicID = change.Current.Topic // the worker's outbox source scope (worker.scopes)
				}
			}
		}
		atts, err := l.store.Attempts(ctx, l.poolOf(tp), l.group, tp, w.Next)
		if err != nil {
			return nil, err
		}
		done, err := l.store.Done(ctx, l.poolOf(tp), l.group, tp, w.Next)
		if err != nil {
			return nil, err
		}
		var parked map[string]int
		if l.set.ParkKeys {
			if parked, err = l.parkStore.Counts(ctx, l.poolOf(tp), l.group, tp.Topic, tp.Partition); err != nil {
				return nil, err
			}
		}
		p := l.newWorker(tp, w, atts, done, parked)
		newParts = append(newParts, p)
		topic := tp.Topic
		starts = append(starts, kafka.TopicPartition{Topic: &topic, Partition: tp.Partition, Offset: kafka.Offset(start)})
	}
	l.mu.Lock()
	for _, p := range newParts {
		if old := l.parts[p.tp]; old != nil { // eager re-assignment of a partition we still run
			l.mu.Unlock()
			old.w.stopAndWait(false)
			l.mu.Lock()
		}
		l.parts[p.tp] = &fetch{w: p}
		go p.run()
	}
	l.mu.Unlock()
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
func (l *Loop) applyStart(ctx context.Context, tp offsetstore.TP, w offsetstore.Watermark, k, low, high int64,
	d offsetstate.Decision, log *zap.Logger) (offsetstore.Watermark, error) {
	audit := func(kind string, from, to int64, reason string) error {
		_, err := l.store.InsertEvent(ctx, l.poolOf(tp), offsetstore.Event{Group: l.group, Topic: tp.Topic, Partition: tp.Partition,
			Kind: kind, From: from, To: to, Actor: "kafkatx.consumer", Reason: reason})
		return err
	}
	if d.IgnoreK {
		log.Error("Kafka committed offset is past the log end; ignoring it", zap.Int64("committed", k), zap.Int64("log_end", high))
		if err := audit(offsetstore.KindKafkaOutOfRange, k, k, fmt.Sprintf("committed offset %d past the log end %d; ignored", k, high)); err != nil {
			return w, err
		}
	}
	if d.State == offsetstate.WatermarkPastLogEnd {
		// The ids recorded with w are the current ones (a changed log is decided before): a
		// known topic id says the same topic's log was truncated, not recreated.
		e := l.set.Halt(Halt{State: string(d.State), Group: l.group, Topic: tp.Topic, Partition: tp.Partition, Watermark: w.Next, Committed: k, LogStart: low, LogEnd: high,
			LogChange: offsetstate.LogChange{Recorded: offsetstate.LogID{Cluster: w.ClusterID, Topic: w.TopicID}, Current: offsetstate.LogID{Cluster: w.ClusterID, Topic: w.TopicID}}})
		log.Error("database watermark past the log end; halting", zap.Int64("watermark", w.Next), zap.Int64("log_end", high), zap.String("topic_id", w.TopicID))
		_ = audit(offsetstore.KindHalt, high, w.Next, e.Error())
		return w, &halted{err: e}
	}
	if d.RetentionFrom >= 0 {
		log.Error("records removed from the log before they were processed; following the log start",
			zap.Int64("watermark", w.Next), zap.Int64("log_start", low), zap.Int64("lost", low-w.Next))
		if _, err := l.follow(ctx, tp, w.Next, low, fmt.Sprintf("log start %d passed the watermark %d: records removed by retention or delete-records before they were processed", low, w.Next)); err != nil {
			return w, err
		}
		l.emit.OffsetsSkipped(tp, offsetstore.KindUnexplainedSkip, w.Next, low)
		w.Next, w.InflightEnd = low, -1
	}
	switch {
	case d.Compared == offsetstate.NoWatermark || d.Compared == offsetstate.Unused:
		hasK := !d.Commit
		nw, err := l.firstRun(ctx, tp, d.Start, hasK)
		if err != nil {
			return w, err
		}
		if nw.Next != d.Start { // another member recorded it first; compare again next time
			return w, fmt.Errorf("watermark of %s appeared concurrently", tp)
		}
		log.Info("first run on partition", zap.Int64("offset", d.Start), zap.Bool("kafka_committed", hasK))
		w = nw
	case d.Compared == offsetstate.KafkaMissing:
		log.Warn("no committed offset in Kafka; starting at the database watermark and re-committing it", zap.Int64("watermark", w.Next))
		if err := audit(offsetstore.KindKafkaMissing, w.Next, w.Next, "no committed offset in Kafka (expired or deleted); database leads"); err != nil {
			return w, err
		}
	case d.Compared == offsetstate.Aligned, d.BehindAfterRetention:
	case d.Compared == offsetstate.KafkaBehind:
		// A rewind with Kafka's own tools is undone here; the way to run [k, watermark) again
		// is kafkatx's replay, quoted in the line (docs/offsets.md).
		log.Warn("Kafka committed offset behind the database watermark (a lost commit, or a rewind with Kafka's own tools); starting at the watermark and re-committing it: nothing runs again. To run the range again, use the replay command",
			zap.Int64("committed", k), zap.Int64("watermark", w.Next),
			zap.String("replay_command", fmt.Sprintf("%s --to-offset %d --mode replay --reason '...' --execute",
				offsetstate.ResetCommand(l.set.Schema, l.group, tp.Topic, tp.Partition, msgfmt.Quote), k)))
		if err := audit(offsetstore.KindKafkaBehind, k, w.Next, "Kafka commit lost or rewound; database leads"); err != nil {
			return w, err
		}
	case d.Compared == offsetstate.KafkaAhead && d.Halt:
		e := l.set.Halt(Halt{State: string(d.Compared), Group: l.group, Topic: tp.Topic, Partition: tp.Partition, Watermark: w.Next, Committed: k, LogStart: low, LogEnd: high})
		log.Error("Kafka committed offset ahead of the database watermark; halting", zap.Int64("committed", k), zap.Int64("watermark", w.Next))
		_ = audit(offsetstore.KindHalt, w.Next, k, "Kafka ahead of the database; policy halt")
		l.emit.Reconciled(tp, d.Drift, d.Start, true)
		return w, &halted{err: e}
	case d.Compared == offsetstate.KafkaAhead:
		kind, err := l.follow(ctx, tp, w.Next, k, "Kafka committed offset ahead of the database watermark with no kafkatx command on record")
		if err != nil {
			return w, err
		}
		if kind == offsetstore.KindUnexplainedSkip {
			log.Error("Kafka committed offset ahead of the database watermark with no kafkatx command on record: following Kafka, offsets skipped unexplained",
				zap.Int64("from", w.Next), zap.Int64("to", k), zap.Int64("skipped", k-w.Next))
		} else {
			log.Warn("following an operator skip", zap.Int64("from", w.Next), zap.Int64("to", k))
		}
		l.emit.OffsetsSkipped(tp, kind, w.Next, k)
		w.Next, w.InflightEnd = k, -1
	}
	if d.Commit {
		l.commits.enqueue(tp, d.Start)
	}
	l.emit.Reconciled(tp, d.Drift, d.Start, false)
	return w, nil
}

// firstRun records a partition's first watermark at start and its first_run audit row in
// one transaction, and returns the stored row (another member's, if it was first).
func (l *Loop) firstRun(ctx context.Context, tp offsetstore.TP, start int64, hasK bool) (offsetstore.Watermark, error) {
	tx, err := l.begin(ctx, tp)
	if err != nil {
		return offsetstore.Watermark{}, fmt.Errorf("record first watermark %s: %w", tp, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := l.confirmFirstRun(ctx, tx, tp); err != nil {
		return offsetstore.Watermark{}, fmt.Errorf("record first watermark %s: %w", tp, err)
	}
	w, created, err := l.store.Init(ctx, tx, l.group, tp, start)
	if err != nil {
		return offsetstore.Watermark{}, err
	}
	if created {
		reason := "no watermark; started at " + startSource(hasK)
		if l.knownTopics[tp.Topic] {
			reason = "a partition new to a topic the group already reads (its partition count was raised); started at " + startSource(hasK)
		}
		if _, err := l.store.InsertEvent(ctx, tx, offsetstore.Event{Group: l.group, Topic: tp.Topic, Partition: tp.Partition,
			Kind: offsetstore.KindFirstRun, From: start, To: start, Actor: "kafkatx.consumer", Reason: reason}); err != nil {
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
func (l *Loop) follow(ctx context.Context, tp offsetstore.TP, w, k int64, reason string) (string, error) {
	tx, err := l.begin(ctx, tp)
	if err != nil {
		return "", fmt.Errorf("follow Kafka on %s: %w", tp, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	kind := offsetstore.KindUnexplainedSkip
	id, err := l.store.PendingSkip(ctx, tx, l.group, tp, w, k)
	if err != nil {
		return "", err
	}
	if id != 0 {
		kind = offsetstore.KindOperatorSkip
		if err := l.store.SetEventStatus(ctx, tx, id, "applied"); err != nil {
			return "", err
		}
	} else if _, err := l.store.InsertEvent(ctx, tx, offsetstore.Event{Group: l.group, Topic: tp.Topic, Partition: tp.Partition,
		Kind: kind, From: w, To: k, Actor: "kafkatx.consumer", Reason: reason}); err != nil {
		return "", err
	}
	// At the assignment, right after its log check: no log id to compare.
	if err := l.store.Advance(ctx, tx, l.group, tp, "", w, k, -1); err != nil {
		return "", err
	}
	if err := l.store.DeleteAttempts(ctx, tx, l.group, tp, w, k); err != nil {
		return "", err
	}
	if err := l.store.DeleteDone(ctx, tx, l.group, tp, k); err != nil {
		return "", err
	}
	if err := tx.Commit(ctx); err != nil {
		return "", fmt.Errorf("follow Kafka on %s: %w", tp, err)
	}
	return kind, nil
}

// onRevoked stops the revoked partitions' workers (their in-flight transactions finish,
// or abort when the partitions were lost), commits their final watermarks unless lost, and
// unassigns them.
func (l *Loop) onRevoked(revoked []kafka.TopicPartition, lost bool) error {
	only := map[offsetstore.TP]bool{}
	var ps []*worker
	l.mu.Lock()
	for _, r := range revoked {
		tp := offsetstore.TP{Topic: *r.Topic, Partition: r.Partition}
		only[tp] = true
		if f := l.parts[tp]; f != nil {
			ps = append(ps, f.w)
		}
	}
	l.mu.Unlock()
	l.stopPartitions(ps, lost)
	defer l.partitionsRevoked(ps, lost)
	if lost {
		l.commits.drop(only)
		l.health.set(func(h *health) { h.joined = false })
		l.log.Warn("partitions lost (the group moved on without this member); in-flight transactions aborted",
			zap.Strings("partitions", finalOffsets(ps)))
	} else {
		_ = l.commits.flush(only)
		l.commits.drop(only) // a commit still refused now must not land after the new owner's
		if len(ps) > 0 {
			l.log.Info("partitions revoked", zap.Strings("partitions", finalOffsets(ps)))
		}
	}
	l.mu.Lock()
	for tp := range only {
		delete(l.parts, tp)
	}
	l.mu.Unlock()
	if l.kc.IsClosed() {
		return nil
	}
	if l.eager {
		return l.kc.Unassign()
	}
	return l.kc.IncrementalUnassign(revoked)
}

// joined records that the member holds an assignment (possibly empty) from the group, and
// clears a group or cluster authorization failure.
func (l *Loop) joined() {
	l.health.set(func(h *health) {
		h.joined = true
		h.rejoining, h.rejoiningSince = "", time.Time{}
		if h.authErr != "" && hasCode(authorizationCodes, h.authCode) {
			h.authErr, h.authSince = "", time.Time{}
		}
	})
}

func (l *Loop) assignedCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.parts)
}

// revokeAll stops every worker and commits their watermarks (used on shutdown).
func (l *Loop) revokeAll(lost bool) {
	l.mu.Lock()
	ps := make([]*worker, 0, len(l.parts))
	for _, f := range l.parts {
		ps = append(ps, f.w)
	}
	l.mu.Unlock()
	l.stopPartitions(ps, lost)
	_ = l.commits.flush(nil)
	l.mu.Lock()
	l.parts = map[offsetstore.TP]*fetch{}
	l.mu.Unlock()
	if len(ps) > 0 {
		l.log.Info("partitions revoked", zap.Strings("partitions", finalOffsets(ps)), zap.String("why", "consumer stopping"))
	}
	l.partitionsRevoked(ps, lost)
}

// finalOffsets names stopped partitions with their watermarks, "topic[partition]@offset".
func finalOffsets(ps []*worker) []string {
	tps := make([]kafka.TopicPartition, len(ps))
	for i, p := range ps {
		tps[i] = p.ktp()
		tps[i].Offset = kafka.Offset(p.watermark.Load())
	}
	return tpOffsets(tps)
}

func (l *Loop) stopPartitions(ps []*worker, lost bool) {
	for _, p := range ps {
		p.requestStop(lost)
	}
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Add(1)
		go func() { defer wg.Done(); p.wait() }() // abandoned workers time out together
	}
	wg.Wait()
}

// partitionsRevoked reports stopped workers with their final watermarks.
func (l *Loop) partitionsRevoked(ps []*worker, lost bool) {
	if len(ps) == 0 {
		return
	}
	final := make([]Position, len(ps))
	for i, p := range ps {
		final[i] = Position{TP: p.tp, Offset: p.watermark.Load()}
	}
	l.emit.PartitionsRevoked(final, lost)
}
