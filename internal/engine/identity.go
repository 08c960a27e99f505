package engine

import (
	"context"
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
// with the watermark. Two admin requests per assignment, none on the hot path: the ids are
// read fresh at each assignment rather than cached across rebalances, because a topic
// recreated while the consumer runs comes back as a new assignment, which a cached id would
// miss.

// logIDs returns the log identity of the topics of tps. The admin client is derived from the
// consumer handle the loop holds now (kafka.NewAdminClientFromConsumer: no new connection),
// per call, so a rebuilt client is the one asked.
func (l *Loop) logIDs(ctx context.Context, tps []offsetstore.TP) (map[string]offsetstate.LogID, error) {
	admin, err := kafka.NewAdminClientFromConsumer(l.kc)
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
		_, _ = l.store.InsertEvent(ctx, l.pool, offsetstore.Event{Group: l.group, Topic: tp.Topic, Partition: tp.Partition,
			Kind: offsetstore.KindHalt, From: w.Next, To: w.Next, Actor: "kafkatx.consumer", Reason: "log changed: " + c.What() + "; nothing processed"})
		l.emit.LogChanged(tp, c, false)
		return w, &halted{err: e}
	}
	start := low
	if l.set.AdoptNewLog == "latest" {
		start = high
	}
	tx, err := l.begin(ctx)
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
