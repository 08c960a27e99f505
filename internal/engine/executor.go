package engine

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/dlq"
	"github.com/kafkatx/kafkatx/idempotency"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/internal/pgerr"
	"github.com/kafkatx/kafkatx/pg"
)

// One message's path, from the poll loop to the Kafka commit, top to bottom:
//
//	Loop.dispatch        the poll loop hands a polled record to its partition's worker
//	worker.run           the worker takes it with what is queued behind it (collect)
//	lane.process         drops what is below the watermark, splits around messages that need care
//	lane.runBatch        in-flight marker, then one optimistic transaction for the batch
//	lane.batchTx         Body (claims, handler, verdict), then the lane's mode's finish
//	lane.runOne          a message alone: durable attempt, oneTx, backoff, dead letter
//	serialMode.finish    the serial lane's end: the watermark's advance (mode.go)
//	worker.advance       gap audit, rows cleared, watermark compare-and-set, the PostgreSQL
//	                     COMMIT (worker.commit: a lost answer settled from txid_status), the new
//	                     watermark to the committer (committer.go), which commits it to Kafka;
//	                     every advance after a batch ends here (advance.go)
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

// run is the worker's goroutine: round after round until it is asked to stop, fenced for
// good, or fails. A round is one batch of the serial lane, or a round of lanes (lanes.go) with
// Concurrency > 1 or while offsets done out of order are left above the watermark — except in
// a suspect range (isolate.go), which the serial lane runs in its pieces whatever Concurrency.
func (p *worker) run() {
	defer close(p.done)
	defer p.abortWork()
	defer p.waits.available(false)
	if p.parked != nil {
		// The retrier of the partition's parked keys (park.go) ends before the worker is done.
		stop, ended := make(chan struct{}), make(chan struct{})
		go func() { defer close(ended); p.retryParked(stop) }()
		defer func() { close(stop); <-ended }()
	}
	for {
		var err error
		if (p.set.Concurrency > 1 || len(p.doneAbove) > 0) && !p.sus.holds(p.watermark.Load()) {
			err = p.laneRound(max(1, p.set.Concurrency))
		} else {
			err = p.serialRound()
		}
		if !p.goOn(err) {
			return
		}
	}
}

// serialRound runs one batch of the serial lane, or passes offsets without a record
// (recordless.go); errStopped when the worker is asked to stop.
func (p *worker) serialRound() error {
	if p.stopping() {
		return errStopped
	}
	var first *kafka.Message
	select {
	case <-p.stopCh:
		return errStopped
	case s := <-p.skips:
		return p.passRecordless(s)
	case first = <-p.in:
	}
	batch := p.collect(first)
	p.busy.Store(int64(len(batch)))
	err := p.waits.holdBack()
	if err == nil {
		err = p.serial.process(p.passDone(batch))
	}
	if err == nil && p.doneRowsTo > p.watermark.Load() {
		// The batch ended with offsets done before: the watermark passes them, and their rows go.
		if err = p.advanceTo(p.doneRowsTo); err == nil {
			p.doneRowsTo = 0
		}
	}
	p.busy.Store(0)
	var held int64
	for _, m := range batch {
		held += messageBytes(m)
	}
	p.bytes.Add(-held)
	return err
}

// passDone drops from batch the offsets lanes applied before a crash (doneAbove): never run
// again; the serial lane's commits delete their rows (serialMode.finish).
func (p *worker) passDone(batch []*kafka.Message) []*kafka.Message {
	if len(p.doneAbove) == 0 {
		return batch
	}
	out := batch[:0:0]
	for _, m := range batch {
		off := int64(m.TopicPartition.Offset)
		if p.doneAbove[off] {
			delete(p.doneAbove, off)
			p.doneRowsTo = max(p.doneRowsTo, off+1)
			p.emit.RedeliveryDropped(p.tp, 1)
			continue
		}
		out = append(out, m)
	}
	return out
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

// process runs batch: messages below the watermark are dropped (a redelivery); the rest are
// cut into transactions by Split (split.go) — a message that needs care runs alone (runOne),
// the others as optimistic batches (runBatch) — never across a piece of a suspect range
// (isolate.go).
func (u *lane) process(batch []*kafka.Message) error {
	u.toPark = nil // failed batches' messages to park are this run's (park.go)
	msgs := batch[:0]
	for _, m := range batch {
		if int64(m.TopicPartition.Offset) < u.p.watermark.Load() {
			u.p.emit.RedeliveryDropped(u.p.tp, 1)
			continue
		}
		msgs = append(msgs, m)
	}
	for len(msgs) > 0 {
		n := len(msgs)
		if o := first(msgs); u.p.sus.holds(o) {
			end := u.p.sus.pieceEnd(o)
			n = sort.Search(len(msgs), func(i int) bool { return int64(msgs[i].TopicPartition.Offset) >= end })
		}
		seg, rest := msgs[:n], len(msgs)-n
		sp := Split{
			Alone: func(i int) bool { return u.needsCare(seg[i]) || u.keyParked(seg[i]) || u.parksNext(seg[i]) },
			Batch: func(i, j int) (int, error) { return u.runBatch(seg[i:j]) },
			One: func(i int) error {
				if u.keyParked(seg[i]) {
					return u.parkBehind(seg[i])
				}
				return u.runOne(seg[i])
			},
			Before: func(i int) error {
				u.mode.held(u, len(seg)-i+rest)
				if u.p.stopping() {
					return errStopped // the current transaction finished; the rest is redelivered to the next owner
				}
				return nil
			},
		}
		if err := u.runPiece(&sp, len(seg), u.p.sus.holds(first(seg)) && u.p.sus.narrowed(u.p.set.BatchSize)); err != nil {
			return err
		}
		msgs = msgs[n:]
	}
	return nil
}

// runPiece runs sp over n messages, alone in the process when alone (a piece of a narrowed
// suspect range, isolate.go): a crash during it is then this piece's, not another
// partition's, and the next start narrows the right range.
func (u *lane) runPiece(sp *Split, n int, alone bool) error {
	if alone {
		ok, err := u.p.gate.alone(u.waits.stop, u.p.set.StuckAfter)
		if err != nil {
			return err
		}
		if ok {
			u.alone = true
			defer func() {
				if u.alone {
					u.alone = false
					u.p.gate.release()
				}
			}()
		}
	}
	return sp.Run(n)
}

// backoffApart waits the backoff before a retry of a (beforeRetry) with the gate given back
// when the lane holds it, so a backoff never holds the process's other partitions.
func (u *lane) backoffApart(a offsetstore.Attempt) error {
	if !u.alone {
		return u.waits.beforeRetry(a)
	}
	u.alone = false
	u.p.gate.release()
	if err := u.waits.beforeRetry(a); err != nil {
		return err
	}
	ok, err := u.p.gate.alone(u.waits.stop, u.p.set.StuckAfter)
	if err != nil {
		return err
	}
	u.alone = ok
	return nil
}

// needsCare reports whether km must run alone in its own transaction: it failed before (an
// attempt row), it is the only offset of its piece of a suspect range (a probe, isolate.go), or
// it is oversized.
func (u *lane) needsCare(km *kafka.Message) bool {
	offset := int64(km.TopicPartition.Offset)
	if u.p.sus.single(offset) || u.oversized(km) {
		return true
	}
	_, ok := u.p.attempt(offset)
	return ok
}

func (u *lane) oversized(km *kafka.Message) bool {
	return u.p.set.MaxValueBytes > 0 && len(km.Value) > u.p.set.MaxValueBytes
}

// runBatch runs msgs optimistically in one transaction. It returns the index of a message
// whose handler failed (its attempt is recorded and the transaction rolled back),
// Unattributed when the batch failed without naming one, or -1 when the batch committed.
func (u *lane) runBatch(msgs []*kafka.Message) (int, error) {
	ctx := u.p.workCtx
	first := int64(msgs[0].TopicPartition.Offset)
	end := int64(msgs[len(msgs)-1].TopicPartition.Offset) + 1
	if err := u.mode.mark(u, first, end); err != nil {
		return -1, err
	}
	var t Tried
	if err := u.waits.untilCharged(first, func() (err error) {
		t, err = u.batchTx(ctx, msgs, end)
		return err
	}); err != nil {
		var ep *errPark
		if errors.As(err, &ep) {
			// Unavailable for one message's key: it runs alone next (runOne), which parks it.
			u.parkLater(msgs[ep.at], ep.cause, true)
			return ep.at, nil
		}
		var ik *errIdleKilled
		if !errors.As(err, &ik) {
			return -1, err
		}
		// A batch of one: its message's failure. Of more, which message holds the transaction
		// idle is unknown: they run again one per transaction (Split), each counted afresh.
		t = Tried{Verdict: Failed, Failed: 0, Cause: ik}
		if len(msgs) > 1 {
			u.waits.idleReset()
			t.Failed = Unattributed
		}
	}
	switch {
	case t.Verdict != Failed:
		return -1, nil
	case t.Failed == Unattributed:
		u.waits.availableUnless(t.Cause)
		u.p.log.Info("batch handler failed without naming a message; running the batch one message per transaction",
			zap.Int("messages", len(msgs)), zap.String("error", pg.SanitizeText(t.Cause.Error(), 512)))
		return Unattributed, nil
	default:
		u.waits.availableUnless(t.Cause)
		off := int64(msgs[t.Failed].TopicPartition.Offset)
		if err := u.recordFailure(offsetstore.Attempt{Offset: off, Attempts: 1}, t.Cause, "handler failed in a batch; isolating the message"); err != nil {
			return -1, err
		}
		if u.mayPark(t.Cause) {
			u.parkLater(msgs[t.Failed], t.Cause, false)
		}
		return t.Failed, nil
	}
}

// markAhead is how far the in-flight marker written with a batch ending at end reaches: over
// the messages already dispatched to the worker, at most one batch beyond end. Marking ahead
// spares the next batch its own marker write (it is covered by the previous commit);
// bounding it bounds what a crash costs, since every offset under the marker is then suspect
// and runs in pieces (isolate.go).
func (p *worker) markAhead(end int64) int64 {
	return max(end, min(p.dispatchedEnd.Load(), end+int64(p.set.BatchSize)))
}

// batchTx runs the body over msgs in one transaction and, when the handler succeeded,
// advances the watermark to end (the lane's mode's finish, mode.go). t.Verdict is Failed for a handler failure at
// t.Failed (or Unattributed); err is a database or fencing error, or errWaited for an
// Unavailable answer, after which untilDone runs it again.
func (u *lane) batchTx(ctx context.Context, msgs []*kafka.Message, end int64) (t Tried, err error) {
	if !u.alone {
		if err := u.p.gate.enter(u.waits.stop); err != nil {
			return t, err
		}
		defer u.p.gate.leave()
	}
	start := time.Now()
	tx, t, err := u.p.body.TryRecords(ctx, u.trackBegin(first(msgs)), u.p.scopes(), msgs, 1)
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
		u.p.set.Signals.step("handled", int64(km.TopicPartition.Offset))
	}
	return t, u.mode.finish(ctx, u, tx, finish{msgs: msgs, end: end, ahead: true, t: &t, start: start})
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
		if IsUnavailable(t.Err) && t.Failed >= 0 && t.Failed < len(msgs) && u.mayPark(t.Cause) {
			// Unavailable for this message's key (park.go): it parks, spending no attempt,
			// unless it is one more of a shared failure — counted in the breaker, as failures
			// are, it opens at the threshold, and the partition then waits as without parking.
			at := msgs[t.Failed]
			if !u.p.breaker.failed(Position{TP: u.p.tp, Offset: int64(at.TopicPartition.Offset)}, errUnavailableAlike, t.Failed == 0) && u.p.breaker.State() == nil {
				return &errPark{cause: t.Cause, at: t.Failed}
			}
		}
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
		if u.p.breaker.failed(Position{TP: u.p.tp, Offset: int64(at.TopicPartition.Offset)}, t.Cause, t.Failed == 0) {
			return &errHeld{cause: t.Cause}
		}
	}
	return nil
}

// runOne runs one message alone: blocking retries with backoff, and the dead letter after the
// last allowed attempt. A try of a crash suspect — the only offset of its piece, or a message
// whose last try crashed — is a probe (isolate.go): it runs alone in the process, its attempt
// recorded durably before the handler runs, so that a crash during it counts as the
// message's own (invariant 3). Other tries record their attempt when they fail; a crash
// during one is found by the marker, never charged to a message that did not run alone.
func (u *lane) runOne(km *kafka.Message) error {
	off := int64(km.TopicPartition.Offset)
	a, _ := u.p.attempt(off)
	if u.oversized(km) {
		return u.deadLetter(km, offsetstore.Attempt{Offset: off, ErrorClass: ClassOversized,
			ErrorMessage: fmt.Sprintf("value of %d bytes exceeds MaxValueBytes %d; the handler did not run", len(km.Value), u.p.set.MaxValueBytes)})
	}
	if pc, ok := u.toPark[off]; ok {
		delete(u.toPark, off)
		if !GiveUp(a.ErrorClass, a.Attempts, u.p.set.MaxAttempts) {
			if ok, err := u.parkHead(km, a, pc.cause, pc.unavailable); ok || err != nil {
				return err
			}
		}
	}
	for {
		if GiveUp(a.ErrorClass, a.Attempts, u.p.set.MaxAttempts) {
			return u.deadLetter(km, a)
		}
		if a.Attempts > 0 && a.ErrorClass != "" {
			a.Offset = off
			if err := u.backoffApart(a); err != nil {
				return err
			}
		}
		herr, err := u.try(km, &a, u.p.sus.single(off) || (a.Attempts > 0 && a.ErrorClass == ""))
		var ep *errPark
		if errors.As(err, &ep) {
			a.Attempts-- // an Unavailable answer spends no attempt
			if ok, err := u.parkHead(km, a, ep.cause, true); ok || err != nil {
				return err
			}
			// A bound refused to park it: wait as without parking, then try again.
			if err := u.waits.waitUnavailable(off, ep.cause); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		if herr == nil {
			u.p.dropAttempt(off)
			return nil
		}
		u.waits.availableUnless(herr)
		if err := u.recordFailure(a, herr, "handler failed"); err != nil {
			return err
		}
		a, _ = u.p.attempt(off)
		if !GiveUp(a.ErrorClass, a.Attempts, u.p.set.MaxAttempts) && u.mayPark(herr) {
			// Its key parks (park.go): the retrier tries it again after the backoff.
			if ok, err := u.parkHead(km, a, herr, false); ok || err != nil {
				return err
			}
		}
	}
}

// try runs try a.Attempts+1 of km (a probe when probe, isolate.go) and sets a.Attempts to it;
// herr is the handler's failure, err a database, fencing or stop error.
func (u *lane) try(km *kafka.Message, a *offsetstore.Attempt, probe bool) (herr, err error) {
	ctx := u.p.workCtx
	off := int64(km.TopicPartition.Offset)
	if err := u.mode.mark(u, off, off+1); err != nil {
		return nil, err
	}
	n := a.Attempts + 1
	alone := u.alone // the piece holds the gate already
	if probe && !alone {
		if alone, err = u.p.gate.alone(u.waits.stop, u.p.set.StuckAfter); err != nil {
			return nil, err
		}
		if alone {
			defer u.p.gate.release()
		}
	}
	if probe {
		if alone {
			// Durable before the handler runs: a crash during this try is the message's own.
			if err := u.waits.untilDone(off, func() error { return u.p.store.BeginAttempt(ctx, u.p.pool, u.p.group, u.p.tp, off, n) }); err != nil {
				return nil, err
			}
			a.Offset, a.Attempts, a.ErrorClass = off, n, "" // the class is unknown until this try ends; a crash leaves it empty
			u.p.setAttempt(off, *a)
		} else {
			u.p.log.Warn("a crash suspect runs with other units: a handler call ran past the stuck bound; a crash now is not counted as the message's",
				zap.Int64("offset", off), zap.Duration("bound", u.p.set.StuckAfter))
		}
	}
	err = u.waits.untilCharged(off, func() (err error) {
		herr, err = u.oneTx(ctx, km, n, alone) // the same try each time: database trouble is not an attempt
		return err
	})
	if ik := (*errIdleKilled)(nil); errors.As(err, &ik) {
		herr, err = ik, nil // its transaction ended by 25P03 every time it runs: the message's failure
	}
	a.Offset, a.Attempts = off, n
	return herr, err
}

// oneTx runs one message's try in its own transaction, among the process's other units
// unless alone (a probe holding the gate). herr is the handler's failure; err a database or
// fencing error, or errWaited for an Unavailable answer.
func (u *lane) oneTx(ctx context.Context, km *kafka.Message, attempt int, alone bool) (herr, err error) {
	if !alone && !u.alone {
		if err := u.p.gate.enter(u.waits.stop); err != nil {
			return nil, err
		}
		defer u.p.gate.leave()
	}
	start := time.Now()
	tx, t, err := u.p.body.TryRecords(ctx, u.trackBegin(int64(km.TopicPartition.Offset)), u.p.scopes(), []*kafka.Message{km}, attempt)
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
	u.p.set.Signals.step("handled", int64(km.TopicPartition.Offset))
	end := int64(km.TopicPartition.Offset) + 1
	return nil, u.mode.finish(ctx, u, tx, finish{msgs: []*kafka.Message{km}, end: end, clearAttempts: true, t: &t, start: start})
}

// recordFailure logs herr (at info, with what) and stores it as the failure of attempt a,
// durably in the attempts table and in u.attempts, so that the message's next try — after a
// crash too — knows its count, class and first failure time.
func (u *lane) recordFailure(a offsetstore.Attempt, herr error, what string) error {
	class, msg, stack := Describe(herr)
	u.p.log.Info(what, zap.Int64("offset", a.Offset), zap.Int("attempt", a.Attempts),
		zap.String("error_class", class), zap.String("error", pg.SanitizeText(msg, 512)))
	if err := u.waits.untilDone(a.Offset, func() error {
		return u.p.store.RecordFailure(u.p.workCtx, u.p.pool, u.p.group, u.p.tp, a.Offset, a.Attempts, class, msg, stack)
	}); err != nil {
		return err
	}
	now := time.Now()
	if a.FirstFailureAt.IsZero() {
		a.FirstFailureAt = now
	}
	a.LastFailureAt, a.ErrorClass, a.ErrorMessage, a.Stack = now, class, msg, stack
	u.p.setAttempt(a.Offset, a)
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
	d := NewDeadLetter(u.p.group, idempotency.Message{Topic: u.p.tp.Topic, Partition: u.p.tp.Partition, Offset: off, Key: km.Key, Value: km.Value},
		km.Timestamp, hs, a, u.p.epoch)
	if err := u.waits.untilDone(off, func() error { return u.deadLetterTx(u.p.workCtx, d, km) }); err != nil {
		return err
	}
	u.p.dropAttempt(off)
	u.p.emit.DeadLettered(u.p.tp, off, d.Attempts, d.ErrorClass)
	u.p.log.Warn("message dead-lettered", zap.Int64("offset", off), zap.Int("attempt", d.Attempts),
		zap.String("error_class", d.ErrorClass), zap.String("error", pg.SanitizeText(d.ErrorMessage, 512)))
	return nil
}

// deadLetterTx writes dead letter d of km, publishes it through the outbox when configured,
// and advances the watermark past it, in one transaction (invariant 4). A panic of
// Config.DeadLetter.Topic is an error of the loop's own work: logged at error level and run
// again (untilDone), so the partition waits for the configuration to be fixed rather than the
// process ending or the dead letter going unpublished.
func (u *lane) deadLetterTx(ctx context.Context, d *dlq.DeadLetter, km *kafka.Message) error {
	tx, err := u.p.begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := DeadLetterTx(ctx, tx, u.p.set.Schema, d, u.p.set.DeadLetterTopic); err != nil {
		return err
	}
	u.p.set.Signals.step("dead-letter", d.Offset)
	return u.mode.finish(ctx, u, tx, finish{msgs: []*kafka.Message{km}, end: d.Offset + 1, clearAttempts: true})
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

// commit commits tx, transaction xid. A COMMIT whose answer is lost — the connection cut, or
// ctx ended (pgx then closes the connection and sends no cancel) — may have committed, may
// not, or may still be committing (waiting for a synchronous standby, during which the
// transaction reads as in progress). The outcome is settled from the database's own record
// before anything else happens (settle): txid_status(xid), asked on another connection, until
// it answers committed (done: nothing runs again) or aborted (the caller runs the transaction
// again, not an attempt); while it answers in progress the partition waits. recorded reads
// the offsets' rows the transaction wrote — a watermark at its end (advance), done rows (a
// lane's unit) — and tells when the server no longer knows xid (docs/design.md,
// "Compare-and-set"). The wait ends when the worker is asked to stop, the outcome then left
// to the partition's next owner, whose compare-and-set on the watermark cannot apply the
// messages twice.
func (p *worker) commit(ctx context.Context, tx pgx.Tx, xid int64, recorded func() bool) error {
	err := tx.Commit(ctx)
	if err == nil {
		return nil
	}
	return p.settle(ctx, err, xid, recorded)
}

// settle decides the outcome of a COMMIT of transaction xid that answered err (see commit):
// nil when the database's record shows it committed, an error (run it again) when it shows
// it aborted; while it reads as in progress, or the database cannot be asked, it waits.
// recorded answers for a transaction the server no longer knows (txid_status NULL), and
// confirms a "committed": after a failover the server asked is a promoted standby, on which
// an xid the old primary gave out after the standby's last replayed record is either in the
// future (txid_status raises 22023: it did not commit there) or, once the new primary has
// given out as many, another transaction's — so "committed" counts only when the offsets'
// rows agree. Running a transaction again that did commit cannot apply it twice: its
// compare-and-set is fenced.
func (p *worker) settle(ctx context.Context, err error, xid int64, recorded func() bool) error {
	rctx := context.WithoutCancel(ctx)
	for try := 1; ; try++ {
		sctx, cancel := context.WithTimeout(rctx, 5*time.Second)
		st, serr := offsetstore.TxStatus(sctx, p.pool, xid)
		cancel()
		switch {
		case serr == nil && st == "committed" && !recorded():
			p.log.Warn("COMMIT answer lost; txid_status shows the xid committed but the offsets' rows do not: the xid is another transaction's on this server (a failover to a standby that never received this one); running it again",
				zap.Int64("xid", xid), zap.Error(err))
			return fmt.Errorf("commit (the xid is another transaction's on this server): %w", err)
		case serr == nil && st == "committed":
			p.log.Warn("COMMIT answer lost; the database's record (txid_status) shows it committed", zap.Int64("xid", xid), zap.Error(err))
			return nil
		case serr != nil && pgerr.IsCode(serr, "22023"): // invalid_parameter_value: "transaction ID … is in the future"
			p.log.Warn("COMMIT answer lost; the xid is in the database's future: it never reached this server (a failover to a standby that lacked it); running it again",
				zap.Int64("xid", xid), zap.Error(err))
			return fmt.Errorf("commit (the xid is in the server's future): %w", err)
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

// first is the offset of msgs' first message.
func first(msgs []*kafka.Message) int64 { return int64(msgs[0].TopicPartition.Offset) }
