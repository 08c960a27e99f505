package kafkatx

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/dlq"
	"github.com/kafkatx/kafkatx/idempotency"
	"github.com/kafkatx/kafkatx/internal/handlercall"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
)

// The three transaction bodies of a partition worker — a batch (batchTx), one message
// (oneTx), a dead letter (deadLetterTx) — and the tail they share (finishTx): gap audit,
// attempts, watermark advance, commit, bookkeeping.

// batchTx runs the handler over msgs in one transaction and advances the watermark to end.
// herr is a handler failure at msgs[failed] (or unattributed); err is a database or fencing
// error, or errWaited for an Unavailable answer.
func (p *partition) batchTx(ctx context.Context, msgs []*kafka.Message, end int64) (failed int, herr, err error) {
	start := time.Now()
	tx, err := p.c.begin(ctx)
	if err != nil {
		return -1, nil, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	cl, failed, herr, err := p.claim(ctx, tx, toMessages(msgs, 1))
	if err != nil || herr != nil {
		return failed, herr, err
	}
	if herr, err := p.call(ctx, tx, cl.fresh); err != nil || herr != nil {
		if err != nil {
			return -1, nil, err
		}
		var me *MessageError
		if errors.As(herr, &me) {
			for i, km := range msgs {
				if int64(km.TopicPartition.Offset) == me.Offset {
					return i, me.Err, nil
				}
			}
		}
		if len(msgs) == 1 {
			return 0, herr, nil
		}
		return unattributed, herr, nil
	}
	for _, km := range msgs {
		hook("handled", int64(km.TopicPartition.Offset))
	}
	return -1, nil, p.finishTx(ctx, tx, msgs, end, p.markAhead(end), false, cl, start)
}

// oneTx runs one message's try in its own transaction. herr is the handler's failure; err a
// database or fencing error, or errWaited for an Unavailable answer.
func (p *partition) oneTx(ctx context.Context, km *kafka.Message, attempt int) (herr, err error) {
	start := time.Now()
	tx, err := p.c.begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	cl, _, herr, err := p.claim(ctx, tx, toMessages([]*kafka.Message{km}, attempt))
	if err != nil || herr != nil {
		return herr, err
	}
	if herr, err := p.call(ctx, tx, cl.fresh); err != nil || herr != nil {
		var me *MessageError
		if errors.As(herr, &me) {
			herr = me.Err
		}
		return herr, err
	}
	hook("handled", int64(km.TopicPartition.Offset))
	return nil, p.finishTx(ctx, tx, []*kafka.Message{km}, int64(km.TopicPartition.Offset)+1, p.inflightEnd, true, cl, start)
}

// deadLetterTx writes dead letter d of km, publishes it through the outbox when configured,
// and advances the watermark past it, in one transaction (invariant 4).
func (p *partition) deadLetterTx(ctx context.Context, d *dlq.DeadLetter, km *kafka.Message) error {
	tx, err := p.c.begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	topic := "" // kept in the database only
	if !p.c.cfg.DeadLetter.Disabled {
		if topic, err = deadLetterTopic(p.c.cfg.DeadLetter.Topic, d.Topic); err != nil {
			return err
		}
	}
	if err := handlercall.WriteDeadLetter(ctx, tx, p.c.cfg.Schema, d, topic); err != nil {
		return err
	}
	hook("dead-letter", d.Offset)
	return p.finishTx(ctx, tx, []*kafka.Message{km}, d.Offset+1, p.inflightEnd, true, claimed{}, time.Time{})
}

// deadLetterTopic calls Config.DeadLetter.Topic (f) for topic. A panic of f is returned as an
// error of the loop's own work: the dead-letter transaction is logged at error level and tried
// again (untilDone), so the partition waits for the configuration to be fixed rather than the
// process ending or the dead letter going unpublished.
func deadLetterTopic(f func(string) string, topic string) (dlqTopic string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("kafkatx: Config.DeadLetter.Topic panicked for topic %q: %v", topic, r)
		}
	}()
	return f(topic), nil
}

// finishTx is the tail that every transaction moving the watermark shares, in this order:
// audit a gap that retention left below msgs' first offset, delete the attempt rows of
// msgs when they had any (clearAttempts), advance the watermark from p.watermark.Load() to end
// (compare-and-set; the in-flight marker to inflightEnd), commit, and record the commit and
// what claim found (cl; empty for a dead letter). start is when a transaction that ran the
// handler began (zero for a dead letter, which deadLetter records).
func (p *partition) finishTx(ctx context.Context, tx pgx.Tx, msgs []*kafka.Message, end, inflightEnd int64, clearAttempts bool, cl claimed, start time.Time) error {
	from := int64(msgs[0].TopicPartition.Offset)
	if err := p.auditGap(ctx, tx, from); err != nil {
		return err
	}
	if clearAttempts {
		if err := p.c.store.DeleteAttempts(ctx, tx, p.c.group, p.tp, from, end); err != nil {
			return err
		}
	}
	if err := p.c.store.Advance(ctx, tx, p.c.group, p.tp, p.watermark.Load(), end, inflightEnd); err != nil {
		return err
	}
	if err := p.commit(ctx, tx, end); err != nil {
		return err
	}
	for _, km := range msgs {
		hook("db-committed", int64(km.TopicPartition.Offset))
	}
	p.inflightEnd = inflightEnd
	p.committed(end)
	if !start.IsZero() {
		p.c.batchCommitted(p, from, end, cl, time.Since(start))
	}
	return nil
}

// call runs the handler over msgs and sorts what it returned (handlercall.Sort): herr is the
// handler's own failure (a panic is recovered as one, with its stack; its own timeout is one;
// a Commit or Rollback of tx, which the handler's wrapper refuses with ErrTxOwnedByLoop, is
// one); err is what the loop retries without an attempt — a retryable PostgreSQL error, tx's
// connection lost, the worker's cancellation, or errWaited for an Unavailable answer still
// within its window.
func (p *partition) call(ctx context.Context, tx pgx.Tx, msgs []*Message) (herr, err error) {
	if len(msgs) == 0 {
		return nil, nil // every message was a duplicate by its business key
	}
	herr = handlercall.CallTx(tx, func(htx pgx.Tx) error { return p.c.handler(ctx, htx, msgs) })
	v, herr := handlercall.Sort(ctx, tx, herr, p.unavailable)
	switch v {
	case handlercall.Done:
		return nil, nil
	case handlercall.Again:
		return nil, herr
	case handlercall.Wait:
		return nil, &errWaited{cause: herr}
	}
	return herr, nil
}

// claimed is what claim found in one transaction's messages.
type claimed struct {
	fresh      []*Message // the handler runs on these: no business key, or its first claim
	dups       int        // skipped: their business key was claimed before
	notChanges int        // skipped: the key function answered idempotency.ErrNotAChange
}

// claim claims the business idempotency keys of msgs in tx and sorts the messages. A key
// function error fails its message (herr at msgs[failed]) as a permanent error, except
// idempotency.ErrNotAChange (a Debezium tombstone, heartbeat, transaction marker): that
// message is skipped, counted, never dead-lettered. A key function panic fails its message
// as a handler panic would (class panic, an attempt; handlercall.ClaimKeys).
func (p *partition) claim(ctx context.Context, tx pgx.Tx, msgs []*Message) (cl claimed, failed int, herr, err error) {
	idem := p.c.cfg.Idempotency
	if idem.Disabled {
		return claimed{fresh: msgs}, -1, nil, nil
	}
	c, failed, kerr, err := handlercall.ClaimKeys(ctx, tx, idempotency.Store{Schema: p.c.cfg.Schema, Retention: idem.Retention},
		p.scope(), idem.Key, keyMessages(msgs))
	var pe *handlercall.Panic
	if errors.As(kerr, &pe) {
		return claimed{}, failed, kerr, nil
	}
	if err != nil || kerr != nil {
		return claimed{}, failed, Permanent(kerr), err
	}
	cl.dups, cl.notChanges = len(c.Dups), len(c.NotChanges)
	if len(c.Fresh) == len(msgs) {
		cl.fresh = msgs
		return cl, -1, nil, nil
	}
	cl.fresh = make([]*Message, len(c.Fresh))
	for j, i := range c.Fresh {
		cl.fresh[j] = msgs[i]
	}
	return cl, -1, nil, nil
}

// keyMessages gives msgs to the idempotency key function.
func keyMessages(msgs []*Message) []idempotency.Message {
	out := make([]idempotency.Message, len(msgs))
	for i, m := range msgs {
		out[i] = idempotency.Message{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: m.Key, Value: m.Value, Header: m.Header}
	}
	return out
}

// scope is the idempotency scope of the partition's group and replay epoch.
func (p *partition) scope() string { return fmt.Sprintf("%s/%d", p.c.group, p.epoch) }

// auditGap records in tx, as an unexplained skip, the offsets below first that the log no
// longer holds: retention overtook the watermark while the partition was assigned, and
// librdkafka reset the fetch to the log start (kafkatx sets its auto.offset.reset to
// earliest, so the gap is exactly [watermark, log start)). Other gaps — compaction,
// transaction markers — are offsets without records and are not audited.
func (p *partition) auditGap(ctx context.Context, tx pgx.Tx, first int64) error {
	w := p.watermark.Load()
	if first <= w {
		return nil
	}
	low, _, err := p.c.kc.GetWatermarkOffsets(p.tp.Topic, p.tp.Partition)
	if err != nil || low <= w {
		return nil
	}
	to := min(low, first)
	p.log.Error("records removed from the log before they were processed (retention or delete-records); auditing the gap",
		zap.Int64("from", w), zap.Int64("to", to))
	_, err = p.c.store.InsertEvent(ctx, tx, offsetstore.Event{Group: p.c.group, Topic: p.tp.Topic, Partition: p.tp.Partition,
		Kind: offsetstore.KindUnexplainedSkip, From: w, To: to, Actor: "kafkatx.consumer",
		Reason: fmt.Sprintf("log start %d passed the watermark %d while the partition was assigned", low, w)})
	if err == nil {
		p.c.offsetsSkipped(p.tp, offsetstore.KindUnexplainedSkip, w, to)
	}
	return err
}

// commit commits tx that moves the watermark to end. After a lost COMMIT reply, a
// watermark that already equals end means the commit happened (docs/design.md, "Compare-and-set").
func (p *partition) commit(ctx context.Context, tx pgx.Tx, end int64) error {
	err := tx.Commit(ctx)
	if err == nil {
		return nil
	}
	ws, rerr := p.c.store.Watermarks(context.WithoutCancel(ctx), p.c.pool, p.c.group, []offsetstore.TP{p.tp})
	if rerr == nil && ws[p.tp].Next == end {
		p.log.Warn("COMMIT reply lost but the watermark shows it committed", zap.Int64("watermark", end), zap.Error(err))
		return nil
	}
	return fmt.Errorf("commit: %w", err)
}

// committed records a database commit that moved the watermark to next and hands the new
// watermark to the Kafka committer.
func (p *partition) committed(next int64) {
	p.available(true)
	p.watermark.Store(next)
	p.c.commits.enqueue(p.tp, next)
	p.c.stats.lastCommit.Store(time.Now().UnixNano())
}

// toMessages converts the records of one transaction, once for the key claims and the
// handler.
func toMessages(kms []*kafka.Message, attempt int) []*Message {
	msgs := make([]*Message, len(kms))
	for i, km := range kms {
		msgs[i] = toMessage(km, attempt)
	}
	return msgs
}

func toMessage(km *kafka.Message, attempt int) *Message {
	m := &Message{
		Topic:     *km.TopicPartition.Topic,
		Partition: km.TopicPartition.Partition,
		Offset:    int64(km.TopicPartition.Offset),
		Key:       km.Key,
		Value:     km.Value,
		Timestamp: km.Timestamp,
		Attempt:   attempt,
	}
	if len(km.Headers) > 0 {
		m.Headers = make([]Header, len(km.Headers))
		for i, h := range km.Headers {
			m.Headers[i] = Header{Key: h.Key, Value: h.Value}
		}
	}
	return m
}
