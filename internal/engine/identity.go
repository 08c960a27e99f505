package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/logid"
	"github.com/kafkatx/kafkatx/internal/offsetstate"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
)

// Which log a watermark is in (docs/offsets.md, "Which log a watermark is in"): a watermark
// counts offsets of one topic of one cluster. A topic deleted and created again under the
// same name, or the same name on another cluster, is another log whose offsets mean nothing
// to it, so on every assignment, before the offsets are compared, the loop reads the
// cluster's id and each assigned topic's id (KIP-516) and compares them with the ids recorded
// with the watermark. One admin request per assignment (logid.Read), none on the hot path: the ids are
// read fresh at each assignment rather than cached across rebalances, because a topic
// recreated while the consumer runs comes back as a new assignment, which a cached id would
// miss.

// logIDs returns the log identity of the topics of tps, asked through kc. The admin client is
// derived from the consumer handle (kafka.NewAdminClientFromConsumer: no new connection), per
// call: the poll loop passes the client it holds now, the running check the client it was
// started with (a rebuilt client's check is its own, stopped before that client is closed:
// rejoin.go).
func (l *Loop) logIDs(ctx context.Context, kc *kafka.Consumer, tps []offsetstore.TP) (map[string]offsetstate.LogID, error) {
	admin, err := kafka.NewAdminClientFromConsumer(kc)
	if err != nil {
		return nil, fmt.Errorf("admin client for the topic and cluster ids: %w", err)
	}
	defer admin.Close()
	topics := make([]string, 0, len(tps))
	for _, tp := range tps {
		topics = append(topics, tp.Topic)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ids, err := logid.Read(ctx, admin, topics)
	if err != nil {
		return nil, fmt.Errorf("read the topic and cluster ids: %w", err)
	}
	return ids, nil
}

// onLogChange handles a partition whose watermark w was recorded in another log than the one
// the broker describes now (c): it halts (the default: nothing is applied from the new log;
// Run returns the Halt's error, a *kafkatx.LogChangedError naming both ids) or, under
// Settings.AdoptNewLog, moves the watermark onto the new log at its start or end, audited
// as log_adopted with both ids, and returns the new watermark (the start offset).
func (l *Loop) onLogChange(ctx context.Context, tp offsetstore.TP, w offsetstore.Watermark, low, high int64,
	c offsetstate.LogChange, log *zap.Logger) (offsetstore.Watermark, error) {
	log = log.With(zap.String("state", string(offsetstate.LogChanged)), zap.Int64("watermark", w.Next),
		zap.String("recorded_topic_id", c.Recorded.Topic), zap.String("topic_id", c.Current.Topic),
		zap.String("recorded_cluster_id", c.Recorded.Cluster), zap.String("cluster_id", c.Current.Cluster))
	if l.set.AdoptNewLog == "" {
		e := l.set.Halt(Halt{State: string(offsetstate.LogChanged), Group: l.group, Topic: tp.Topic, Partition: tp.Partition,
			Watermark: w.Next, Committed: -1, LogStart: low, LogEnd: high, LogChange: c})
		log.Error("the log behind the watermark changed ("+c.What()+"); halting: nothing applied from the new log", zap.Int64("log_start", low), zap.Int64("log_end", high))
		_, _ = l.store.InsertEvent(ctx, l.poolOf(tp), offsetstore.Event{Group: l.group, Topic: tp.Topic, Partition: tp.Partition,
			Kind: offsetstore.KindHalt, From: w.Next, To: w.Next, Actor: "kafkatx.consumer", Reason: "log changed: " + c.What() + "; nothing processed"})
		l.emit.LogChanged(tp, c, false)
		return w, &halted{err: e}
	}
	start := low
	if l.set.AdoptNewLog == "latest" {
		start = high
	}
	tx, err := l.begin(ctx, tp)
	if err != nil {
		return w, fmt.Errorf("adopt the new log of %s: %w", tp, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	id, err := l.store.InsertEvent(ctx, tx, offsetstore.Event{Group: l.group, Topic: tp.Topic, Partition: tp.Partition,
		Kind: offsetstore.KindLogAdopted, From: w.Next, To: start, Actor: "kafkatx.consumer",
		Reason: fmt.Sprintf("log changed: %s; adopted from its %s (Config.OnLogChange)", c.What(), l.set.AdoptNewLog)})
	if err != nil {
		return w, err
	}
	if err := l.store.AdoptLog(ctx, tx, l.group, tp, w.Next, start, c.Current.Topic, c.Current.Cluster, id); err != nil {
		return w, err
	}
	if err := tx.Commit(ctx); err != nil {
		return w, fmt.Errorf("adopt the new log of %s: %w", tp, err)
	}
	log.Warn("the log behind the watermark changed ("+c.What()+"); adopted the new log (Config.OnLogChange)", zap.Int64("start", start))
	l.emit.LogChanged(tp, c, true)
	w.Next, w.First, w.InflightEnd, w.TopicID, w.ClusterID = start, start, -1, c.Current.Topic, c.Current.Cluster
	l.commits.enqueue(tp, start)
	l.emit.Reconciled(tp, 0, start, false)
	return w, nil
}

// logRewound handles a record below partition p's watermark that the client delivered on its
// own — the loop only ever seeks to a watermark, so librdkafka went back by itself: its fetch
// at the watermark was out of range (the log now ends below it) and auto.offset.reset, which
// kafkatx keeps at earliest, restarted it at the log start. The log under the watermark is
// another one (the topic deleted and created again while the consumer runs) or was truncated
// (an unclean leader election). Before, the records below the watermark were dropped as
// redeliveries and those above applied: the new log followed silently. Now the partition is
// paused and the consumer halts as it does at an assignment, with *kafkatx.LogChangedError
// when the topic or cluster id differs from the recorded one, else *kafkatx.LogRangeError;
// nothing of the new log is applied (the record that revealed it is not handed to the
// worker, and the loop stops before the next poll). Runs on the poll goroutine.
func (l *Loop) logRewound(p *worker, off int64) {
	if l.fatal != nil {
		return
	}
	tp, w := p.tp, p.watermark.Load()
	if err := l.kc.Pause([]kafka.TopicPartition{p.ktp()}); err != nil {
		l.log.Warn("pause partition", zap.String("topic", tp.Topic), zap.Int32("partition", tp.Partition), zap.Error(err))
	}
	log := l.log.With(zap.String("topic", tp.Topic), zap.Int32("partition", tp.Partition))
	ctx := context.Background()
	low, high, err := l.kc.QueryWatermarkOffsets(tp.Topic, tp.Partition, 10000)
	if err != nil {
		low, high = -1, -1
	}
	l.mu.Lock()
	recorded := l.recordedLog[tp]
	l.mu.Unlock()
	if ids, err := l.logIDs(ctx, l.kc, []offsetstore.TP{tp}); err == nil {
		if c := offsetstate.CompareLog(recorded, ids[tp.Topic]); c.Changed() {
			_, err := l.onLogChange(ctx, tp, offsetstore.Watermark{TP: tp, Next: w}, low, high, c, log.With(zap.Int64("rewound_to", off)))
			var h *halted
			if errors.As(err, &h) {
				l.fatal = h.err
				return
			}
			// Adopting while running would race the worker's in-flight transaction: halt; the
			// next start adopts (Config.OnLogChange) at its assignment.
		}
	} else {
		log.Warn("read the topic and cluster ids after the client went back below the watermark", zap.Error(err))
	}
	e := l.set.Halt(Halt{State: string(offsetstate.WatermarkPastLogEnd), Group: l.group, Topic: tp.Topic, Partition: tp.Partition,
		Watermark: w, Committed: -1, LogStart: low, LogEnd: high, LogChange: offsetstate.LogChange{Recorded: recorded, Current: recorded}})
	log.Error("the client went back below the watermark on its own: the log now ends below it; halting", zap.Int64("watermark", w),
		zap.Int64("rewound_to", off), zap.Int64("log_start", low), zap.Int64("log_end", high), zap.String("state", string(offsetstate.WatermarkPastLogEnd)))
	_, _ = l.store.InsertEvent(ctx, l.poolOf(tp), offsetstore.Event{Group: l.group, Topic: tp.Topic, Partition: tp.Partition,
		Kind: offsetstore.KindHalt, From: max(high, 0), To: w, Actor: "kafkatx.consumer", Reason: e.Error()})
	l.fatal = e
}

// logCheckEvery is how often watchLogs compares the assigned partitions' logs with the ones
// their watermarks are in while the consumer runs.
const logCheckEvery = 5 * time.Second

// watchLogs runs until quit is closed: every logCheckEvery it reads the cluster's and the
// assigned topics' ids (one admin request; none while Kafka is unreachable) and, when one differs from the log a partition's
// watermark is in, stops the consumer with the halt's error (*kafkatx.LogChangedError), as
// an assignment would. It covers the recreated topic that already holds the watermark's
// offsets when the client reaches it, so that librdkafka goes on fetching at the watermark
// in the new log without going back (logRewound catches the rest at its first record): the
// new log's records are applied for at most logCheckEvery, plus the client's metadata
// refresh, before the consumer stops — a window, not a guarantee, which the next start's
// assignment then refuses.
func (l *Loop) watchLogs(kc *kafka.Consumer, quit <-chan struct{}) {
	t := time.NewTicker(logCheckEvery)
	defer t.Stop()
	// seen is each partition's watermark read just before a check that still found the old
	// log: every record below it was fetched before that check, so from the old log (ids
	// never come back). A change found later may have let records [seen, watermark) of the
	// new log through, and the report says so.
	seen := map[offsetstore.TP]int64{}
	for {
		select {
		case <-quit:
			return
		case <-t.C:
		}
		// The recorded log and the watermark of each assigned partition, read before the
		// check's request (so every record below that watermark was fetched before it).
		l.mu.Lock()
		rec := make(map[offsetstore.TP]offsetstate.LogID, len(l.parts))
		before := make(map[offsetstore.TP]int64, len(l.parts))
		tps := make([]offsetstore.TP, 0, len(l.parts))
		for tp, f := range l.parts {
			rec[tp] = l.recordedLog[tp]
			before[tp] = f.w.watermark.Load()
			tps = append(tps, tp)
		}
		l.mu.Unlock()
		var unreachable bool // no admin request into an outage (a frozen broker answers them all at once)
		l.health.set(func(h *health) { unreachable = h.kafkaErr != "" })
		if len(rec) == 0 || unreachable {
			continue
		}
		for tp := range seen {
			if _, ok := rec[tp]; !ok {
				delete(seen, tp) // revoked: a new assignment checks the log again
			}
		}
		ids, err := l.logIDs(context.Background(), kc, tps)
		if err != nil {
			continue // a broker outage or a topic being deleted: the next tick, or the assignment, decides
		}
		for tp, r := range rec {
			c := offsetstate.CompareLog(r, ids[tp.Topic])
			if !c.Changed() {
				seen[tp] = before[tp]
				continue
			}
			l.mu.Lock()
			f := l.parts[tp]
			l.mu.Unlock()
			if f == nil {
				continue
			}
			w := f.w.watermark.Load()
			from, ok := seen[tp]
			if !ok {
				from = f.w.startedAt // no check since the assignment, whose own check saw the old log there
			}
			log := l.log.With(zap.String("topic", tp.Topic), zap.Int32("partition", tp.Partition), zap.String("found_by", "running check"))
			e := l.set.Halt(Halt{State: string(offsetstate.LogChanged), Group: l.group, Topic: tp.Topic, Partition: tp.Partition,
				Watermark: w, Committed: -1, LogStart: -1, LogEnd: -1, LogChange: c, Running: true, AppliedFrom: from})
			reason := "log changed while running: " + c.What() + "; stopped; nothing applied since the last check"
			if from < w {
				reason = fmt.Sprintf("log changed while running: %s; stopped; offsets [%d, %d) were applied after the last check that saw the old log and may be the new log's", c.What(), from, w)
			}
			log.Error("the log behind the watermark changed while the consumer ran ("+c.What()+"); stopping", zap.Int64("watermark", w),
				zap.Int64("applied_since_last_check_from", from), zap.String("state", string(offsetstate.LogChanged)))
			_, _ = l.store.InsertEvent(context.Background(), l.poolOf(tp), offsetstore.Event{Group: l.group, Topic: tp.Topic, Partition: tp.Partition,
				Kind: offsetstore.KindHalt, From: from, To: w, Actor: "kafkatx.consumer", Reason: reason})
			l.emit.LogChanged(tp, c, false)
			l.failed.CompareAndSwap(nil, &e)
			return
		}
	}
}
