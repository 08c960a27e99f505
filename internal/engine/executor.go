package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/dlq"
	"github.com/kafkatx/kafkatx/idempotency"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/pg"
)

// One message's path, from the poll loop to the Kafka commit, top to bottom:
//
//	Loop.dispatch        the poll loop hands a polled record to its partition's worker
//	worker.run           the worker takes it with what is queued behind it (collect)
//	lane.process         drops what is below the watermark, splits around messages that need care
//	lane.runBatch        in-flight marker, then one optimistic transaction for the batch
//	lane.batchTx         Body (claims, handler, verdict), then finishTx
//	lane.runOne          a message alone: durable attempt, oneTx, backoff, dead letter
//	lane.finishTx        gap audit, attempts cleared, watermark compare-and-set, then
//	worker.commit        the PostgreSQL COMMIT (a lost answer settled from txid_status)
//	worker.committed     the new watermark to the committer (committer.go), which commits it to Kafka
//
// Every wait on the way (database retries, Unavailable, Backpressure, backoff) is in waits.go.

// dispatch hands a polled message to its partition worker without blocking the poll loop.
// When the worker's queue is full the message is kept in memory. A partition holding more
// than its share of Config.MaxBufferedBytes is paused, and resumed once it holds half of it.
// Pausing is the exception, not the flow control of every batch: a resumed partition waits for
// a new fetch (measured: about 0.4 s, which halved the drain rate when partitions paused every
// few batches). librdkafka resumes a paused partition at the offset after the last message it
// returned, so nothing is skipped (docs/design.md, "Pausing moves the fetch position").
func (l *Loop) dispatch(m *kafka.Message) {
	tp := offsetstore.TP{Topic: *m.TopicPartition.Topic, Partition: m.TopicPartition.Partition}
	f := l.parts[tp]
	if f == nil || f.w.stopping() {
		return // not ours (any more); whoever owns it reads it from its watermark
	}
	p := f.w
	off := int64(m.TopicPartition.Offset)
	l.set.Signals.step("polled", off)
	l.lastMessage.Store(time.Now().UnixNano())
	if off < p.watermark.Load() && off < p.dispatchedEnd.Load() {
		l.logRewound(p, off) // the client went back below the watermark on its own (identity.go)
		return
	}
	if off < p.dispatchedEnd.Load() {
		l.emit.RedeliveryDropped(tp, 1)
		return
	}
	p.dispatchedEnd.Store(off + 1)
	p.bytes.Add(messageBytes(m))
	if len(f.pending) == 0 {
		select {
		case p.in <- m:
			return
		default:
		}
	}
	f.pending = append(f.pending, m)
	f.pendingLen.Store(int64(len(f.pending)))
	if !f.paused && p.bytes.Load() > l.bufferShare() {
		if err := l.kc.Pause([]kafka.TopicPartition{p.ktp()}); err != nil {
			l.log.Warn("pause partition", zap.String("topic", tp.Topic), zap.Int32("partition", tp.Partition), zap.Error(err))
			return
		}
		f.paused = true
		l.emit.PartitionPaused(tp, p.bytes.Load())
	}
}

// run is the worker's goroutine: batch after batch until it is asked to stop, fenced for good,
// or fails.
func (p *worker) run() {
	if p.set.Concurrency > 1 || len(p.doneAbove) > 0 {
		p.runLanes() // lanes.go
		return
	}
	defer close(p.done)
	defer p.abortWork()
	defer p.waits.available(false)
	for {
		if p.stopping() {
			p.clearInflight()
			return
		}
		var first *kafka.Message
		select {
		case <-p.stopCh:
			p.clearInflight()
			return
		case s := <-p.skips:
			if !p.goOn(p.passRecordless(s)) {
				return
			}
			continue
		case first = <-p.in:
		}
		batch := p.collect(first)
		p.busy.Store(int64(len(batch)))
		err := p.waits.holdBack()
		if err == nil {
			err = p.serial.process(batch)
		}
		p.busy.Store(0)
		var held int64
		for _, m := range batch {
			held += messageBytes(m)
		}
		p.bytes.Add(-held)
		if !p.goOn(err) {
			return
		}
	}
}

// collect takes up to Batch.Size messages: those already queued, and more for up to
// Batch.Wait.
func (p *worker) collect(first *kafka.Message) []*kafka.Message {
	size := p.set.BatchSize
	batch := make([]*kafka.Message, 1, min(size, 1+len(p.in)))
	batch[0] = first
	var timeout <-chan time.Time
	if p.set.BatchWait > 0 {
		t := time.NewTimer(p.set.BatchWait)
		defer t.Stop()
		timeout = t.C
	}
	for len(batch) < size {
		select {
		case m := <-p.in:
			batch = append(batch, m)
			continue
		default:
		}
		if timeout == nil {
			break
		}
		select {
		case m := <-p.in:
			batch = append(batch, m)
			continue
		case <-timeout:
		case <-p.stopCh:
		}
		break
	}
	return batch
}

// process runs batch: messages below the watermark are dropped (a redelivery); a message that
// needs care runs alone (runOne); the others run as optimistic batches (runBatch), and a batch
// that failed without naming its message runs again one message per transaction.
func (u *lane) process(batch []*kafka.Message) error {
	msgs := batch[:0]
	for _, m := range batch {
		if int64(m.TopicPartition.Offset) < u.watermark.Load() {
			u.emit.RedeliveryDropped(u.tp, 1)
			continue
		}
		msgs = append(msgs, m)
	}
	split := 0 // while > 0, the next split messages run one per transaction
	for len(msgs) > 0 {
		if u.stopping() {
			return errStopped // the current transaction finished; the rest is redelivered to the next owner
		}
		if u.needsCare(msgs[0]) {
			if err := u.runOne(msgs[0]); err != nil {
				return err
			}
			msgs = msgs[1:]
			split = max(split-1, 0)
			u.held(len(msgs))
			continue
		}
		limit := len(msgs)
		if split > 0 {
			limit = 1
		}
		j := 1
		for j < limit && !u.needsCare(msgs[j]) {
			j++
		}
		failed, err := u.runBatch(msgs[:j])
		switch {
		case err != nil:
			return err
		case failed == -1:
			msgs = msgs[j:]
			split = max(split-j, 0)
			u.held(len(msgs))
		case failed == Unattributed:
			// The batch handler failed without naming a message: run these one per
			// transaction, so the failure names its message.
			split = j
		}
		// Otherwise msgs[failed] now has an attempt row: the next round commits the
		// messages before it as a batch, then runs it alone.
	}
	return nil
}

// needsCare reports whether km must run alone in its own transaction: it failed before, it
// was in flight when a previous owner crashed (docs/design.md: no bisection by repeated
// crashes), or it is oversized.
func (u *lane) needsCare(km *kafka.Message) bool {
	offset := int64(km.TopicPartition.Offset)
	if offset < u.crashedUntil || u.oversized(km) {
		return true
	}
	_, ok := u.attempt(offset)
	return ok
}

func (u *lane) oversized(km *kafka.Message) bool {
	return u.set.MaxValueBytes > 0 && len(km.Value) > u.set.MaxValueBytes
}

// runBatch runs msgs optimistically in one transaction. It returns the index of a message
// whose handler failed (its attempt is recorded and the transaction rolled back),
// Unattributed when the batch failed without naming one, or -1 when the batch committed.
func (u *lane) runBatch(msgs []*kafka.Message) (int, error) {
	ctx := u.workCtx
	first := int64(msgs[0].TopicPartition.Offset)
	end := int64(msgs[len(msgs)-1].TopicPartition.Offset) + 1
	if u.isSerial && end > u.inflightEnd { // with lanes, the coordinator marks before it dispatches
		ahead := u.markAhead(end)
		if err := u.waits.untilDone(first, func() error {
			return u.store.MarkInflight(ctx, u.pool, u.group, u.tp, u.watermark.Load(), ahead)
		}); err != nil {
			return -1, err
		}
		u.inflightEnd = ahead
	}
	var t Tried
	if err := u.waits.untilDone(first, func() (err error) {
		t, err = u.batchTx(ctx, msgs, end)
		return err
	}); err != nil {
		return -1, err
	}
	switch {
	case t.Verdict != Failed:
		return -1, nil
	case t.Failed == Unattributed:
		u.waits.availableUnless(t.Cause)
		u.log.Info("batch handler failed without naming a message; running the batch one message per transaction",
			zap.Int("messages", len(msgs)), zap.String("error", pg.SanitizeText(t.Cause.Error(), 512)))
		return Unattributed, nil
	default:
		u.waits.availableUnless(t.Cause)
		off := int64(msgs[t.Failed].TopicPartition.Offset)
		if err := u.recordFailure(offsetstore.Attempt{Offset: off, Attempts: 1}, t.Cause, "handler failed in a batch; isolating the message"); err != nil {
			return -1, err
		}
		return t.Failed, nil
	}
}

// markAhead is how far the in-flight marker written with a batch ending at end reaches: over
// the messages already dispatched to the worker, at most one batch beyond end. Marking ahead
// spares the next batch its own marker write (it is covered by the previous commit);
// bounding it bounds what a crash costs, since every offset under the marker then runs one
// message per transaction (docs/design.md, "No bisection by crashing"). Unbounded, a crash
// with 25,000 messages dispatched per partition cost about 45 s of one-per-transaction
// recovery.
func (p *worker) markAhead(end int64) int64 {
	return max(end, min(p.dispatchedEnd.Load(), end+int64(p.set.BatchSize)))
}

// batchTx runs the body over msgs in one transaction and, when the handler succeeded,
// advances the watermark to end (finishTx). t.Verdict is Failed for a handler failure at
// t.Failed (or Unattributed); err is a database or fencing error, or errWaited for an
// Unavailable answer, after which untilDone runs it again.
func (u *lane) batchTx(ctx context.Context, msgs []*kafka.Message, end int64) (t Tried, err error) {
	start := time.Now()
	tx, t, err := u.body.TryRecords(ctx, u.trackBegin(first(msgs)), u.scope(), msgs, 1)
	u.handlerEnded()
	if tx != nil {
		defer tx.Rollback(context.WithoutCancel(ctx))
	}
	if err != nil {
		return t, err
	}
	if err := u.verdict(&t, msgs); err != nil || t.Verdict == Failed {
		return t, err
	}
	for _, km := range msgs {
		u.set.Signals.step("handled", int64(km.TopicPartition.Offset))
	}
	return t, u.finishTx(ctx, tx, msgs, end, u.markAhead(end), false, &t, start)
}

// verdict turns a try's verdict over msgs into the loop's next step: Again is an error
// untilDone runs the transaction again on (never an attempt); Wait is errWaited while the
// partition's Unavailable window lasts, then a failure (t.Verdict becomes Failed); a failure
// the open breaker holds is errHeld (no attempt, breaker.go); Done and other failures are left
// to the caller.
func (u *lane) verdict(t *Tried, msgs []*kafka.Message) error {
	switch t.Verdict {
	case Again:
		return t.Err
	case Wait:
		if u.waits.stillUnavailable(t.Err) {
			return &errWaited{cause: t.Err}
		}
		t.Verdict = Failed
	}
	if t.Verdict == Failed && t.Cause != nil && PermanentCause(t.Cause) == nil {
		at := msgs[0]
		if t.Failed >= 0 && t.Failed < len(msgs) {
			at = msgs[t.Failed]
		}
		// Counted only when the failing message is the first of its transaction: later in a
		// batch, the messages before it have not committed, and may (a pill among them).
		if u.breaker.failed(Position{TP: u.tp, Offset: int64(at.TopicPartition.Offset)}, t.Cause, t.Failed == 0) {
			return &errHeld{cause: t.Cause}
		}
	}
	return nil
}

// runOne runs one message alone, with a durable attempt count written before each try,
// blocking retries with backoff, and the dead letter after the last allowed attempt.
func (u *lane) runOne(km *kafka.Message) error {
	ctx := u.workCtx
	off := int64(km.TopicPartition.Offset)
	a, ok := u.attempt(off)
	if !ok && off < u.crashedUntil {
		// Attempted by a batch that never committed: the crash counts once.
		a = offsetstore.Attempt{Offset: off, Attempts: 1}
	}
	if u.oversized(km) {
		return u.deadLetter(km, offsetstore.Attempt{Offset: off, ErrorClass: ClassOversized,
			ErrorMessage: fmt.Sprintf("value of %d bytes exceeds MaxValueBytes %d; the handler did not run", len(km.Value), u.set.MaxValueBytes)})
	}
	for {
		if GiveUp(a.ErrorClass, a.Attempts, u.set.MaxAttempts) {
			return u.deadLetter(km, a)
		}
		if a.Attempts > 0 && a.ErrorClass != "" {
			a.Offset = off
			if err := u.waits.beforeRetry(a); err != nil {
				return err
			}
		}
		n := a.Attempts + 1
		// Durable before the handler runs: a crash during this try counts (invariant 3).
		if err := u.waits.untilDone(off, func() error { return u.store.BeginAttempt(ctx, u.pool, u.group, u.tp, off, n) }); err != nil {
			return err
		}
		a.Attempts = n
		a.ErrorClass = "" // unknown until this try ends; a crash leaves it empty
		u.setAttempt(off, a)
		var herr error
		if err := u.waits.untilDone(off, func() (err error) {
			herr, err = u.oneTx(ctx, km, n) // the same try each time: database trouble is not an attempt
			return err
		}); err != nil {
			return err
		}
		if herr == nil {
			u.dropAttempt(off)
			return nil
		}
		u.waits.availableUnless(herr)
		if err := u.recordFailure(a, herr, "handler failed"); err != nil {
			return err
		}
		a, _ = u.attempt(off)
	}
}

// oneTx runs one message's try in its own transaction. herr is the handler's failure; err a
// database or fencing error, or errWaited for an Unavailable answer.
func (u *lane) oneTx(ctx context.Context, km *kafka.Message, attempt int) (herr, err error) {
	start := time.Now()
	tx, t, err := u.body.TryRecords(ctx, u.trackBegin(int64(km.TopicPartition.Offset)), u.scope(), []*kafka.Message{km}, attempt)
	u.handlerEnded()
	if tx != nil {
		defer tx.Rollback(context.WithoutCancel(ctx))
	}
	if err != nil {
		return nil, err
	}
	if err := u.verdict(&t, []*kafka.Message{km}); err != nil || t.Verdict == Failed {
		return t.Cause, err
	}
	u.set.Signals.step("handled", int64(km.TopicPartition.Offset))
	return nil, u.finishTx(ctx, tx, []*kafka.Message{km}, int64(km.TopicPartition.Offset)+1, u.inflight(), true, &t, start)
}

// recordFailure logs herr (at info, with what) and stores it as the failure of attempt a,
// durably in the attempts table and in u.attempts, so that the message's next try — after a
// crash too — knows its count, class and first failure time.
func (u *lane) recordFailure(a offsetstore.Attempt, herr error, what string) error {
	class, msg, stack := Describe(herr)
	u.log.Info(what, zap.Int64("offset", a.Offset), zap.Int("attempt", a.Attempts),
		zap.String("error_class", class), zap.String("error", pg.SanitizeText(msg, 512)))
	if err := u.waits.untilDone(a.Offset, func() error {
		return u.store.RecordFailure(u.workCtx, u.pool, u.group, u.tp, a.Offset, a.Attempts, class, msg, stack)
	}); err != nil {
		return err
	}
	now := time.Now()
	if a.FirstFailureAt.IsZero() {
		a.FirstFailureAt = now
	}
	a.LastFailureAt, a.ErrorClass, a.ErrorMessage, a.Stack = now, class, msg, stack
	u.setAttempt(a.Offset, a)
	return nil
}

// deadLetter dead-letters km after attempt a (deadLetterTx, run until it commits) and
// records it.
func (u *lane) deadLetter(km *kafka.Message, a offsetstore.Attempt) error {
	off := int64(km.TopicPartition.Offset)
	var hs []dlq.Header
	for _, h := range km.Headers {
		hs = append(hs, dlq.Header{Key: h.Key, Value: h.Value})
	}
	d := NewDeadLetter(u.group, idempotency.Message{Topic: u.tp.Topic, Partition: u.tp.Partition, Offset: off, Key: km.Key, Value: km.Value},
		km.Timestamp, hs, a, u.epoch)
	if err := u.waits.untilDone(off, func() error { return u.deadLetterTx(u.workCtx, d, km) }); err != nil {
		return err
	}
	u.dropAttempt(off)
	u.emit.DeadLettered(u.tp, off, d.Attempts, d.ErrorClass)
	u.log.Warn("message dead-lettered", zap.Int64("offset", off), zap.Int("attempt", d.Attempts),
		zap.String("error_class", d.ErrorClass), zap.String("error", pg.SanitizeText(d.ErrorMessage, 512)))
	return nil
}

// deadLetterTx writes dead letter d of km, publishes it through the outbox when configured,
// and advances the watermark past it, in one transaction (invariant 4). A panic of
// Config.DeadLetter.Topic is an error of the loop's own work: logged at error level and run
// again (untilDone), so the partition waits for the configuration to be fixed rather than the
// process ending or the dead letter going unpublished.
func (u *lane) deadLetterTx(ctx context.Context, d *dlq.DeadLetter, km *kafka.Message) error {
	tx, err := u.begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := DeadLetterTx(ctx, tx, u.set.Schema, d, u.set.DeadLetterTopic); err != nil {
		return err
	}
	u.set.Signals.step("dead-letter", d.Offset)
	return u.finishTx(ctx, tx, []*kafka.Message{km}, d.Offset+1, u.inflight(), true, nil, time.Time{})
}

// finishTx is the tail that every transaction moving the watermark over messages shares, in
// this order: audit a gap that retention left below msgs' first offset, delete the attempt
// rows of msgs when they had any (clearAttempts), advance the watermark from u.watermark to
// end (compare-and-set; the in-flight marker to inflightEnd), commit, and record the commit
// with what the body found (t; nil for a dead letter, which deadLetter records). start is when
// the transaction began.
func (u *lane) finishTx(ctx context.Context, tx pgx.Tx, msgs []*kafka.Message, end, inflightEnd int64, clearAttempts bool, t *Tried, start time.Time) error {
	from := int64(msgs[0].TopicPartition.Offset)
	if !u.isSerial {
		return u.finishUnitTx(ctx, tx, msgs, clearAttempts, t, start) // lanes.go
	}
	if err := u.auditGap(ctx, tx, from); err != nil {
		return err
	}
	if clearAttempts {
		if err := u.store.DeleteAttempts(ctx, tx, u.group, u.tp, from, end); err != nil {
			return err
		}
	}
	xid, err := u.store.AdvanceXID(ctx, tx, u.group, u.tp, u.watermark.Load(), end, inflightEnd)
	if err != nil {
		return err
	}
	if err := u.commit(ctx, tx, end, xid); err != nil {
		return err
	}
	for _, km := range msgs {
		u.set.Signals.step("db-committed", int64(km.TopicPartition.Offset))
	}
	u.inflightEnd = inflightEnd
	u.waits.available(true)
	u.committed(end)
	if t != nil && t.Verdict == Done {
		u.breaker.succeeded() // handled messages committed: a spell of shared failures ends
	}
	if t != nil {
		u.emit.BatchCommitted(u.tp, from, end, *t, time.Since(start))
	}
	return nil
}

// auditGap records in tx, as an unexplained skip, the offsets below first that the log no
// longer holds: retention overtook the watermark while the partition was assigned, and
// librdkafka reset the fetch to the log start (kafkatx sets its auto.offset.reset to
// earliest, so the gap is exactly [watermark, log start)). Other gaps — compaction,
// transaction markers — are offsets without records and are not audited.
func (p *worker) auditGap(ctx context.Context, tx pgx.Tx, first int64) error {
	w := p.watermark.Load()
	if first <= w {
		return nil
	}
	low, _, err := p.logEnds(p.tp)
	if err != nil || low <= w {
		return nil
	}
	to := min(low, first)
	p.log.Error("records removed from the log before they were processed (retention or delete-records); auditing the gap",
		zap.Int64("from", w), zap.Int64("to", to))
	_, err = p.store.InsertEvent(ctx, tx, offsetstore.Event{Group: p.group, Topic: p.tp.Topic, Partition: p.tp.Partition,
		Kind: offsetstore.KindUnexplainedSkip, From: w, To: to, Actor: "kafkatx.consumer",
		Reason: fmt.Sprintf("log start %d passed the watermark %d while the partition was assigned", low, w)})
	if err == nil {
		p.emit.OffsetsSkipped(p.tp, offsetstore.KindUnexplainedSkip, w, to)
	}
	return err
}

// commit commits tx, transaction xid, that moves the watermark to end. A COMMIT whose answer
// is lost — the connection cut, or ctx ended (pgx then closes the connection and sends no
// cancel) — may have committed, may not, or may still be committing (waiting for a
// synchronous standby, during which the transaction reads as in progress). The outcome is
// settled from the database's own record before anything else happens: txid_status(xid),
// asked on another connection, until it answers committed (done: nothing runs again) or
// aborted (the caller runs the transaction again, not an attempt); while it answers in
// progress the partition waits. When the server no longer knows xid, a watermark at end
// means committed (docs/design.md, "Compare-and-set"). The wait ends when the worker is asked
// to stop, the outcome then left to the partition's next owner, whose compare-and-set on the
// watermark cannot apply the messages twice.
func (p *worker) commit(ctx context.Context, tx pgx.Tx, end, xid int64) error {
	err := tx.Commit(ctx)
	if err == nil {
		return nil
	}
	return p.settle(ctx, err, xid, func() bool {
		ws, rerr := p.store.Watermarks(context.WithoutCancel(ctx), p.pool, p.group, []offsetstore.TP{p.tp})
		return rerr == nil && ws[p.tp].Next == end
	})
}

// settle decides the outcome of a COMMIT of transaction xid that answered err (see commit):
// nil when the database's record shows it committed, an error (run it again) when it shows
// it aborted; while it reads as in progress, or the database cannot be asked, it waits.
// recorded answers for a transaction the server no longer knows (txid_status NULL).
func (p *worker) settle(ctx context.Context, err error, xid int64, recorded func() bool) error {
	rctx := context.WithoutCancel(ctx)
	for try := 1; ; try++ {
		sctx, cancel := context.WithTimeout(rctx, 5*time.Second)
		st, serr := offsetstore.TxStatus(sctx, p.pool, xid)
		cancel()
		switch {
		case serr == nil && st == "committed":
			p.log.Warn("COMMIT answer lost; the database's record (txid_status) shows it committed", zap.Int64("xid", xid), zap.Error(err))
			return nil
		case serr == nil && st == "aborted":
			return fmt.Errorf("commit (the database's record shows it aborted): %w", err)
		case serr == nil && st == "":
			if recorded() {
				p.log.Warn("COMMIT answer lost but the offsets' rows show it committed", zap.Error(err))
				return nil
			}
			return fmt.Errorf("commit: %w", err)
		}
		if try == 1 || try%50 == 0 {
			p.log.Warn("COMMIT answer lost and its outcome not known yet (in progress, or the database unreachable); waiting for the database's record",
				zap.Int64("xid", xid), zap.String("status", st), zap.NamedError("status_error", serr), zap.Error(err))
		}
		if p.waits.sleep(200*time.Millisecond) != nil {
			return fmt.Errorf("commit outcome unknown when the partition stopped (xid %d): %w", xid, err)
		}
	}
}

// committed records a database commit that moved the watermark to next and hands the new
// watermark to the Kafka committer (committer.go), the last step of a message's path.
func (p *worker) committed(next int64) {
	p.watermark.Store(next)
	p.commits.enqueue(p.tp, next)
	p.lastCommit.Store(time.Now().UnixNano())
}

// first is the offset of msgs' first message.
func first(msgs []*kafka.Message) int64 { return int64(msgs[0].TopicPartition.Offset) }
