package engine

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/offsetstate"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
)

// Database rollbacks: the database lost its last transactions (a failover to a standby that
// asynchronous replication left behind, a point-in-time restore) while Kafka kept the offsets
// the consumer committed after them. The consumer writes a CommitMark (offsetstate) with each
// offset commit, naming the database and the partition's replay epoch, so that such a
// committed offset K ahead of the watermark W is told from an operator's move (Kafka's tools
// and `kafkatx offsets reset` write no mark): on assignment (reconcile, state
// database_rolled_back) and under a running consumer (checkRollbacks, then worker.refence)
// the consumer re-processes [W, K) from W and audits it as rollback_replayed
// (docs/offsets.md, "Database rollbacks").

// rollbackCheckEvery is how often a running consumer compares its idle partitions'
// watermarks with the database's (checkRollbacks), and reads the database's identity.
const rollbackCheckEvery = 2 * time.Second

// marksOf maps Kafka's answer to a committed-offsets read to the CommitMark of each partition
// whose metadata carries one.
func marksOf(res []kafka.TopicPartition) map[offsetstore.TP]offsetstate.CommitMark {
	out := map[offsetstore.TP]offsetstate.CommitMark{}
	for _, k := range res {
		if k.Topic == nil || k.Metadata == nil {
			continue
		}
		if m, ok := offsetstate.ParseCommitMark(*k.Metadata); ok {
			out[offsetstore.TP{Topic: *k.Topic, Partition: k.Partition}] = m
		}
	}
	return out
}

// readDatabase reads the identity of shard s's database and keeps it for the commit marks; a
// changed timeline is logged.
func (l *Loop) readDatabase(ctx context.Context, s *shard) (offsetstate.Database, error) {
	d, err := offsetstore.Database(ctx, s.pool)
	if err != nil {
		return d, err
	}
	if old := s.db.Swap(&d); old != nil && old.Same(d) && old.Timeline != d.Timeline {
		l.log.Warn("the database is on a new timeline (a failover or a point-in-time restore); checking every partition's watermark",
			zap.Uint32("old_timeline", old.Timeline), zap.Uint32("timeline", d.Timeline))
	} else if old != nil && !old.Same(d) {
		l.log.Warn("the database is another cluster or database than before (its system identifier or OID changed)",
			zap.String("old_system_identifier", old.System), zap.String("system_identifier", d.System))
	}
	return d, nil
}

// commitMark is the metadata of an offset commit of tp (committer.go): nil until the identity
// of tp's database was read.
func (l *Loop) commitMark(tp offsetstore.TP, epoch int) *string {
	d := l.shardOf(tp).db.Load()
	if d == nil {
		return nil
	}
	s := offsetstate.CommitMark{Database: *d, Epoch: epoch}.String()
	return &s
}

// replayRollback audits, on assignment, that the database lost [w, k) of tp which the
// consumer had committed as mark: the range is re-processed from w (the decision's Start).
func (l *Loop) replayRollback(ctx context.Context, tp offsetstore.TP, w, k int64, mark offsetstate.CommitMark, log *zap.Logger) error {
	now := offsetstate.Database{}
	if d := l.shardOf(tp).db.Load(); d != nil {
		now = *d
	}
	reason := fmt.Sprintf("Kafka's committed offset %d was committed by kafkatx on this database (timeline %d, replay epoch %d) "+
		"but the database's watermark is %d (timeline %d): the database lost those transactions (a failover or a restore); re-processing [%d, %d)",
		k, mark.Timeline, mark.Epoch, w, now.Timeline, w, k)
	if _, err := l.store.InsertEvent(ctx, l.poolOf(tp), offsetstore.Event{Group: l.group, Topic: tp.Topic, Partition: tp.Partition,
		Kind: offsetstore.KindRollbackReplay, From: w, To: k, Actor: "kafkatx.consumer", Reason: reason}); err != nil {
		return err
	}
	log.Warn("database rolled back: Kafka's committed offset was committed by kafkatx on this database; re-processing the lost range from the watermark",
		zap.Int64("from", w), zap.Int64("to", k), zap.Uint32("old_timeline", mark.Timeline), zap.Uint32("timeline", now.Timeline))
	l.emit.RollbackReplayed(tp, w, k)
	return nil
}

// checkRollbacks runs on the poll loop's goroutine every rollbackCheckEvery: in the
// background (one check at a time) it reads the database's identity and the watermarks of the
// idle partitions, and asks each worker whose database watermark is below its own — the
// database lost transactions under a running consumer — to re-read it (worker.refence seeks
// back and audits the range), as it asks a worker of a sharded loop whose watermark row left
// its shard (a shard move: worker.refence places the partition again). A partition with traffic finds out by itself: its next
// compare-and-set is fenced.
func (l *Loop) checkRollbacks(running *atomic.Bool) {
	type idle struct {
		p *worker
		w int64
	}
	var ps []idle
	tps := map[*pgxpool.Pool][]offsetstore.TP{} // per shard
	for _, f := range l.parts {
		p := f.w
		if f.paused || len(f.pending) > 0 || p.stopping() || f.inFlight() > 0 {
			continue
		}
		ps = append(ps, idle{p: p, w: p.watermark.Load()}) // read before the database's
		tps[p.pool] = append(tps[p.pool], p.tp)
	}
	if !running.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer running.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), rollbackCheckEvery)
		defer cancel()
		ws := map[offsetstore.TP]offsetstore.Watermark{}
		for _, s := range l.allShards() {
			if _, err := l.readDatabase(ctx, s); err != nil {
				return
			}
			if len(tps[s.pool]) == 0 {
				continue
			}
			sw, err := l.store.Watermarks(ctx, s.pool, l.group, tps[s.pool])
			if err != nil {
				return
			}
			for tp, w := range sw {
				ws[tp] = w
			}
		}
		for _, i := range ps {
			// Below the worker's: a rollback. Gone, on a sharded loop: a shard move took the
			// partition's state elsewhere, and the idle owner re-reads the directory now,
			// not at its next batch (a shard restored meanwhile would hold the row again).
			w, ok := ws[i.p.tp]
			if (ok && w.Next < i.w || !ok && l.set.Placer != nil) && i.p.watermark.Load() == i.w {
				select {
				case i.p.skips <- recordless{from: i.w, to: i.w, reread: true}:
				default: // one is pending already; the next check asks again
				}
			}
		}
	}()
}

// rolledBack audits, after a re-read found the database's watermark next below the worker's
// own old one, that the database lost [next, old) under the running consumer: the worker
// seeks back to next and re-processes it. The audit row is best effort (the database just
// came back); the log line and the metric are not.
func (p *worker) rolledBack(old, next int64) {
	now := offsetstate.Database{}
	if d := p.db.Load(); d != nil {
		now = *d
	}
	ctx, cancel := context.WithTimeout(p.workCtx, 10*time.Second)
	defer cancel()
	if by, err := p.store.RewoundByHand(ctx, p.pool, p.group, p.tp, next); err == nil && by {
		p.log.Warn("watermark set back by hand under the running consumer (an unexplained_move row on record); re-processing from it",
			zap.Int64("from", next), zap.Int64("to", old))
		return
	}
	p.log.Warn("database rolled back under the running consumer (a failover or a restore): its watermark is below the one this worker committed; re-processing the lost range",
		zap.Int64("from", next), zap.Int64("to", old), zap.Uint32("timeline", now.Timeline))
	if _, err := p.store.InsertEvent(ctx, p.pool, offsetstore.Event{Group: p.group, Topic: p.tp.Topic, Partition: p.tp.Partition,
		Kind: offsetstore.KindRollbackReplay, From: next, To: old, Actor: "kafkatx.consumer",
		Reason: fmt.Sprintf("the database's watermark %d fell below %d, which this consumer had committed (timeline now %d): the database lost those transactions (a failover or a restore); re-processing [%d, %d)",
			next, old, now.Timeline, next, old)}); err != nil {
		p.log.Warn("audit the rollback", zap.Error(err))
	}
	p.emit.RollbackReplayed(p.tp, next, old)
}
