package kafkatx

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/dlq"
	"github.com/kafkatx/kafkatx/idempotency"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/outbox"
)

var errStopped = errors.New("partition worker stopped")

// stepHook, when set (only by tests), is called at named steps of the loop so a test can
// SIGKILL the process there: "polled", "handled" (handler ran, transaction not committed),
// "db-committed" (database committed, Kafka not yet), "dead-letter" (inside the
// dead-letter transaction).
var stepHook func(step string, offset int64)

func hook(step string, offset int64) {
	if stepHook != nil {
		stepHook(step, offset)
	}
}

// partition is the worker of one assigned partition. Messages are processed in offset
// order; each batch runs in one transaction that also advances the watermark.
type partition struct {
	c   *Consumer
	tp  offsetstore.TP
	log *zap.Logger
	in  chan *kafka.Message

	// Owned by the poll loop.
	pending []*kafka.Message
	paused  bool
	next    int64 // offsets below were already handed to the worker

	// Read from any goroutine.
	dispatchedEnd atomic.Int64 // next, for the worker's in-flight marker
	pendingLen    atomic.Int64
	bytes         atomic.Int64 // messageBytes of every message held (queued, kept, in a batch)
	busy          atomic.Int64 // messages the worker holds (in a batch or a backoff)
	watermark     atomic.Int64
	epoch         int // replay epoch: scopes business idempotency keys

	// Owned by the worker.
	w            int64 // the database watermark: next offset to process
	inflightEnd  int64 // durable marker: offsets [w, inflightEnd) are marked attempted
	crashedUntil int64 // offsets below had a marker when loaded: a crash counts one attempt each
	attempts     map[int64]offsetstore.Attempt

	stopOnce  sync.Once
	stopCh    chan struct{} // closed: finish the current transaction and return
	workCtx   context.Context
	abortWork context.CancelFunc // cancels in-flight handler and database calls
	done      chan struct{}
}

func newPartition(c *Consumer, tp offsetstore.TP, w offsetstore.Watermark, atts map[int64]offsetstore.Attempt) *partition {
	ctx, cancel := context.WithCancel(context.Background())
	p := &partition{
		c:           c,
		tp:          tp,
		log:         c.log.With(zap.String("topic", tp.Topic), zap.Int32("partition", tp.Partition)),
		in:          make(chan *kafka.Message, 2*c.cfg.Batch.Size),
		next:        w.Next,
		w:           w.Next,
		inflightEnd: w.InflightEnd,
		epoch:       w.ReplayEpoch,
		attempts:    atts,
		stopCh:      make(chan struct{}),
		workCtx:     ctx,
		abortWork:   cancel,
		done:        make(chan struct{}),
	}
	if w.InflightEnd > w.Next {
		p.crashedUntil = w.InflightEnd
		p.log.Warn("a batch was in flight when the last owner stopped; its offsets run one message per transaction",
			zap.Int64("from", w.Next), zap.Int64("to", w.InflightEnd))
	}
	p.dispatchedEnd.Store(w.Next)
	p.watermark.Store(w.Next)
	return p
}

func (p *partition) ktp() kafka.TopicPartition {
	t := p.tp.Topic
	return kafka.TopicPartition{Topic: &t, Partition: p.tp.Partition}
}

func (p *partition) inFlight() int {
	return len(p.in) + int(p.pendingLen.Load()) + int(p.busy.Load())
}

func (p *partition) stopping() bool {
	select {
	case <-p.stopCh:
		return true
	default:
		return false
	}
}

// requestStop asks the worker to finish its current transaction and return. When lost, or
// when the shutdown timeout passes, in-flight work is aborted.
func (p *partition) requestStop(lost bool) {
	p.stopOnce.Do(func() {
		close(p.stopCh)
		if lost {
			p.abortWork()
			return
		}
		t := time.AfterFunc(p.c.cfg.ShutdownTimeout, func() {
			p.log.Warn("shutdown timeout: aborting the in-flight transaction", zap.Duration("timeout", p.c.cfg.ShutdownTimeout))
			p.abortWork()
		})
		go func() { <-p.done; t.Stop() }()
	})
}

func (p *partition) wait() { <-p.done }

func (p *partition) stopAndWait(lost bool) {
	p.requestStop(lost)
	p.wait()
}

func (p *partition) run() {
	defer close(p.done)
	defer p.abortWork()
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
		case first = <-p.in:
		}
		batch := p.collect(first)
		p.busy.Store(int64(len(batch)))
		err := p.process(batch)
		p.busy.Store(0)
		var held int64
		for _, m := range batch {
			held += messageBytes(m)
		}
		p.bytes.Add(-held)
		switch {
		case err == nil:
		case errors.Is(err, errStopped):
			p.clearInflight()
			return
		case errors.Is(err, offsetstore.ErrFenced):
			if !p.refence() {
				return
			}
		default:
			// Not expected: the loop's own errors are retried. Stop the consumer rather
			// than leave the partition assigned and unprocessed.
			p.c.fail(fmt.Errorf("partition %s: %w", p.tp, err))
			return
		}
	}
}

// clearInflight removes the in-flight marker when the worker stops cleanly: the messages it
// covered but never ran are not attempts, so the next owner runs them as a normal batch. A
// worker whose transaction was aborted (lost partition, shutdown timeout) keeps it: its
// handler may have run.
func (p *partition) clearInflight() {
	if p.workCtx.Err() != nil || p.inflightEnd <= p.w {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.c.store.MarkInflight(ctx, p.c.pool, p.c.group, p.tp, p.w, p.w); err != nil {
		p.log.Debug("clear the in-flight marker", zap.Error(err))
		return
	}
	p.inflightEnd = p.w
}

// collect takes up to Batch.Size messages: those already queued, and more for up to
// Batch.Wait.
func (p *partition) collect(first *kafka.Message) []*kafka.Message {
	size := p.c.cfg.Batch.Size
	batch := make([]*kafka.Message, 1, min(size, 1+len(p.in)))
	batch[0] = first
	var timeout <-chan time.Time
	if p.c.cfg.Batch.Wait > 0 {
		t := time.NewTimer(p.c.cfg.Batch.Wait)
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

// refence reloads the partition's state after a fenced watermark update and asks the poll
// loop to drop what it holds and seek to the database watermark. It reports whether the
// worker should go on.
func (p *partition) refence() bool {
	ctx := p.workCtx
	p.log.Warn("watermark fenced: another consumer advanced it; re-reading the database watermark")
	var w offsetstore.Watermark
	var atts map[int64]offsetstore.Attempt
	for t := 1; ; t++ {
		ws, err := p.c.store.Watermarks(ctx, p.c.pool, p.c.group, []offsetstore.TP{p.tp})
		if err == nil {
			var ok bool
			if w, ok = ws[p.tp]; !ok {
				err = fmt.Errorf("watermark of %s deleted", p.tp)
			} else {
				atts, err = p.c.store.Attempts(ctx, p.c.pool, p.c.group, p.tp, w.Next)
			}
		}
		if err == nil {
			break
		}
		if p.afterDBError(t, err) != nil {
			return false
		}
	}
	p.w, p.inflightEnd, p.attempts, p.epoch = w.Next, w.InflightEnd, atts, w.ReplayEpoch
	p.crashedUntil = max(p.crashedUntil, w.InflightEnd)
	p.watermark.Store(w.Next)
	r := resyncRequest{p: p, at: w.Next, done: make(chan struct{})}
	select {
	case p.c.resyncs <- r:
	case <-p.stopCh:
		return false
	}
	select {
	case <-r.done:
		return true
	case <-p.stopCh:
		return false
	}
}

// needsCare reports whether offset must run alone in its own transaction: it failed
// before, or it was in flight when a previous owner crashed (DESIGN.md: no bisection by
// repeated crashes).
func (p *partition) needsCare(km *kafka.Message) bool {
	offset := int64(km.TopicPartition.Offset)
	if offset < p.crashedUntil || p.oversized(km) {
		return true
	}
	_, ok := p.attempts[offset]
	return ok
}

func (p *partition) process(batch []*kafka.Message) error {
	msgs := batch[:0]
	for _, m := range batch {
		if int64(m.TopicPartition.Offset) < p.w {
			p.c.stats.duplicates.Add(1)
			p.c.metrics.duplicates.WithLabelValues(p.c.group, p.tp.Topic).Inc()
			continue
		}
		msgs = append(msgs, m)
	}
	split := 0 // while > 0, the next split messages run one per transaction
	for len(msgs) > 0 {
		if p.stopping() {
			return errStopped // the current transaction finished; the rest is redelivered to the next owner
		}
		if p.needsCare(msgs[0]) {
			if err := p.runOne(msgs[0]); err != nil {
				return err
			}
			msgs = msgs[1:]
			split = max(split-1, 0)
			p.busy.Store(int64(len(msgs)))
			continue
		}
		limit := len(msgs)
		if split > 0 {
			limit = 1
		}
		j := 1
		for j < limit && !p.needsCare(msgs[j]) {
			j++
		}
		failed, err := p.runBatch(msgs[:j])
		switch {
		case err != nil:
			return err
		case failed == -1:
			msgs = msgs[j:]
			split = max(split-j, 0)
			p.busy.Store(int64(len(msgs)))
		case failed == unattributed:
			// The batch handler failed without naming a message: run these one per
			// transaction, so the failure names its message.
			split = j
		}
		// Otherwise msgs[failed] now has an attempt row: the next round commits the
		// messages before it as a batch, then runs it alone.
	}
	return nil
}

// unattributed is runBatch's answer when a batch failed without naming its message.
const unattributed = -2

// committed records a database commit that moved the watermark to next and hands the new
// watermark to the Kafka committer.
func (p *partition) committed(next int64, processed, dead int) {
	p.w = next
	p.watermark.Store(next)
	p.c.commits.enqueue(p.tp, next)
	p.c.stats.lastCommit.Store(time.Now().UnixNano())
	if processed > 0 {
		p.c.stats.processed.Add(int64(processed))
		p.c.metrics.processed.WithLabelValues(p.c.group, p.tp.Topic).Add(float64(processed))
	}
}

// waitRetry sleeps d unless the worker is asked to stop.
func (p *partition) waitRetry(d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-p.stopCh:
		return errStopped
	}
}

// afterDBError decides what follows an error of the loop's own database work (not the
// handler's): errStopped when the worker is stopping, the error itself when fenced, else a
// backoff after which the caller runs the statement or transaction again — never an attempt.
// Errors that are not retryable conditions (a missing table, a revoked permission) are logged
// at error level: the partition waits for an operator rather than skipping anything. n is
// the caller's try count, for the backoff.
func (p *partition) afterDBError(n int, err error) error {
	if p.workCtx.Err() != nil {
		return errStopped
	}
	if errors.Is(err, offsetstore.ErrFenced) {
		return err
	}
	d := p.c.cfg.Retry.Backoff(min(n, 8))
	if retryableDB(err) {
		fields := []zap.Field{zap.Error(err), zap.Duration("backoff", d)}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "25P03" {
			fields = append(fields, zap.String("hint", fmt.Sprintf("the transaction sat idle longer than Config.Transaction.IdleTimeout (%s): "+
				"this process was frozen or cut off, or the handler waits on something other than the database inside its transaction", p.c.cfg.Transaction.IdleTimeout)))
		}
		p.log.Warn("retryable database error; running it again (not an attempt)", fields...)
	} else {
		p.log.Error("database error in the loop's own statements; the partition waits and tries again", zap.Error(err), zap.Duration("backoff", d))
	}
	if werr := p.waitRetry(d); werr != nil {
		return werr
	}
	return nil
}

// runBatch runs msgs optimistically in one transaction. It returns the index of a message
// whose handler failed (its attempt is recorded and the transaction rolled back), or -1
// when the batch committed.
func (p *partition) runBatch(msgs []*kafka.Message) (int, error) {
	ctx := p.workCtx
	end := int64(msgs[len(msgs)-1].TopicPartition.Offset) + 1
	for try := 1; ; try++ {
		if end > p.inflightEnd {
			ahead := p.markAhead(end)
			if err := p.c.store.MarkInflight(ctx, p.c.pool, p.c.group, p.tp, p.w, ahead); err != nil {
				if err := p.afterDBError(try, err); err != nil {
					return -1, err
				}
				continue
			}
			p.inflightEnd = ahead
		}
		start := time.Now()
		failed, herr, err := p.batchTx(ctx, msgs, end)
		switch {
		case err == nil && herr == nil:
			p.c.metrics.batchSeconds.Observe(time.Since(start).Seconds())
			return -1, nil
		case herr != nil && failed == unattributed:
			p.log.Info("batch handler failed without naming a message; running the batch one message per transaction",
				zap.Int("messages", len(msgs)), zap.String("error", dlq.SanitizeText(herr.Error(), 512)))
			return unattributed, nil
		case herr != nil:
			m := msgs[failed]
			class, msg, stack := describe(herr)
			p.log.Info("handler failed in a batch; isolating the message", zap.Int64("offset", int64(m.TopicPartition.Offset)),
				zap.Int("attempt", 1), zap.String("error_class", class), zap.String("error", dlq.SanitizeText(msg, 512)))
			for t := 1; ; t++ {
				err := p.c.store.RecordFailure(ctx, p.c.pool, p.c.group, p.tp, int64(m.TopicPartition.Offset), 1, class, msg, stack)
				if err == nil {
					break
				}
				if err := p.afterDBError(t, err); err != nil {
					return -1, err
				}
			}
			now := time.Now()
			p.attempts[int64(m.TopicPartition.Offset)] = offsetstore.Attempt{Offset: int64(m.TopicPartition.Offset), Attempts: 1,
				FirstFailureAt: now, LastFailureAt: now, ErrorClass: class, ErrorMessage: msg, Stack: stack}
			return failed, nil
		default:
			if err := p.afterDBError(try, err); err != nil {
				return -1, err
			}
		}
	}
}

// markAhead is how far the in-flight marker written with a batch ending at end reaches: over
// the messages already dispatched to the worker, at most one batch beyond end. Marking ahead
// spares the next batch its own marker write (it is covered by the previous commit);
// bounding it bounds what a crash costs, since every offset under the marker then runs one
// message per transaction (DESIGN.md). Unbounded, a crash with 25,000 messages dispatched per
// partition cost about 45 s of one-per-transaction recovery.
func (p *partition) markAhead(end int64) int64 {
	return max(end, min(p.dispatchedEnd.Load(), end+int64(p.c.cfg.Batch.Size)))
}

// batchTx runs the handler over msgs in one transaction and advances the watermark to end.
// herr is a handler failure at msgs[failed]; err is a database or fencing error.
func (p *partition) batchTx(ctx context.Context, msgs []*kafka.Message, end int64) (failed int, herr, err error) {
	tx, err := p.c.begin(ctx)
	if err != nil {
		return -1, nil, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	fresh, dups, failed, herr, err := p.claim(ctx, tx, toMessages(msgs, 1))
	if err != nil || herr != nil {
		return failed, herr, err
	}
	if err := p.call(ctx, tx, fresh); err != nil {
		if retryableDB(err) || ctx.Err() != nil {
			return -1, nil, err
		}
		var me *MessageError
		if errors.As(err, &me) {
			for i, km := range msgs {
				if int64(km.TopicPartition.Offset) == me.Offset {
					return i, me.Err, nil
				}
			}
		}
		if len(msgs) == 1 {
			return 0, err, nil
		}
		return unattributed, err, nil
	}
	for _, km := range msgs {
		hook("handled", int64(km.TopicPartition.Offset))
	}
	if err := p.auditGap(ctx, tx, int64(msgs[0].TopicPartition.Offset)); err != nil {
		return -1, nil, err
	}
	ahead := p.markAhead(end)
	if err := p.c.store.Advance(ctx, tx, p.c.group, p.tp, p.w, end, ahead); err != nil {
		return -1, nil, err
	}
	if err := p.commit(ctx, tx, end); err != nil {
		return -1, nil, err
	}
	for _, km := range msgs {
		hook("db-committed", int64(km.TopicPartition.Offset))
	}
	p.inflightEnd = ahead
	p.committed(end, len(fresh), 0)
	p.duplicates(dups)
	return -1, nil, nil
}

// auditGap records in tx, as an unexplained skip, the offsets below first that the log no
// longer holds: retention overtook the watermark while the partition was assigned, and
// librdkafka reset the fetch to the log start (kafkatx sets its auto.offset.reset to
// earliest, so the gap is exactly [watermark, log start)). Other gaps — compaction,
// transaction markers — are offsets without records and are not audited.
func (p *partition) auditGap(ctx context.Context, tx pgx.Tx, first int64) error {
	if first <= p.w {
		return nil
	}
	low, _, err := p.c.kc.GetWatermarkOffsets(p.tp.Topic, p.tp.Partition)
	if err != nil || low <= p.w {
		return nil
	}
	to := min(low, first)
	p.log.Error("records removed from the log before they were processed (retention or delete-records); auditing the gap",
		zap.Int64("from", p.w), zap.Int64("to", to))
	_, err = p.c.store.InsertEvent(ctx, tx, offsetstore.Event{Group: p.c.group, Topic: p.tp.Topic, Partition: p.tp.Partition,
		Kind: offsetstore.KindUnexplainedSkip, From: p.w, To: to, Actor: "kafkatx.consumer",
		Reason: fmt.Sprintf("log start %d passed the watermark %d while the partition was assigned", low, p.w)})
	if err == nil {
		p.c.stats.skipped.Add(to - p.w)
		p.c.metrics.skipped.WithLabelValues(p.c.group, p.tp.Topic, offsetstore.KindUnexplainedSkip).Add(float64(to - p.w))
	}
	return err
}

// claim claims the business idempotency keys of msgs in tx and returns the messages whose
// handler must run: those without a key and those claiming theirs first. A key function
// error fails its message (herr at msgs[failed]) as a permanent error.
func (p *partition) claim(ctx context.Context, tx pgx.Tx, msgs []*Message) (fresh []*Message, dups, failed int, herr, err error) {
	idem := p.c.cfg.Idempotency
	if idem.Disabled {
		return msgs, 0, -1, nil, nil
	}
	var keys []string
	var keyed []int
	for i, m := range msgs {
		k, ok, kerr := idem.Key(idempotency.Message{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: m.Key, Value: m.Value, Header: m.Header})
		if kerr != nil {
			return nil, 0, i, Permanent(fmt.Errorf("idempotency key: %w", kerr)), nil
		}
		if ok && len(k) > idempotency.MaxKeyBytes {
			return nil, 0, i, Permanent(fmt.Errorf("idempotency key of %d bytes is longer than %d", len(k), idempotency.MaxKeyBytes)), nil
		}
		if ok && k != "" {
			keys = append(keys, k)
			keyed = append(keyed, i)
		}
	}
	if len(keys) == 0 {
		return msgs, 0, -1, nil, nil
	}
	first, err := idempotency.ClaimManyTx(ctx, tx, p.c.cfg.Schema, p.scope(), keys, idem.Retention)
	if err != nil {
		return nil, 0, -1, nil, err
	}
	skip := make(map[int]bool, len(keys))
	for j, ok := range first {
		if !ok {
			skip[keyed[j]] = true
		}
	}
	fresh = make([]*Message, 0, len(msgs)-len(skip))
	for i, m := range msgs {
		if !skip[i] {
			fresh = append(fresh, m)
		}
	}
	return fresh, len(skip), -1, nil, nil
}

// scope is the idempotency scope of the partition's group and replay epoch.
func (p *partition) scope() string { return fmt.Sprintf("%s/%d", p.c.group, p.epoch) }

func (p *partition) duplicates(n int) {
	if n > 0 {
		p.c.stats.duplicates.Add(int64(n))
		p.c.metrics.duplicates.WithLabelValues(p.c.group, p.tp.Topic).Add(float64(n))
	}
}

// commit commits tx that moves the watermark to end. After a lost COMMIT reply, a
// watermark that already equals end means the commit happened (DESIGN.md).
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

// call runs the handler over msgs, recovering a panic as an error with its stack.
func (p *partition) call(ctx context.Context, tx pgx.Tx, msgs []*Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &panicError{value: r, stack: debug.Stack()}
		}
	}()
	if len(msgs) == 0 {
		return nil // every message was a duplicate by its business key
	}
	return p.c.handler(ctx, tx, msgs)
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

// describe splits a handler failure into its class, message and (for panics) stack.
func describe(err error) (class, msg, stack string) {
	class = errorClass(err)
	msg = err.Error()
	var perm *PermanentError
	if errors.As(err, &perm) {
		msg = perm.Err.Error() // the class already says "permanent"
	}
	var pe *panicError
	if errors.As(err, &pe) {
		stack = string(pe.stack)
	}
	return class, dlq.SanitizeText(msg, dlq.MaxErrorMessageBytes), dlq.SanitizeText(stack, dlq.MaxStackBytes)
}

func (p *partition) oversized(km *kafka.Message) bool {
	return p.c.cfg.MaxValueBytes > 0 && len(km.Value) > p.c.cfg.MaxValueBytes
}

// runOne runs one message alone, with a durable attempt count written before each try,
// blocking retries with backoff, and the dead letter after the last allowed attempt.
func (p *partition) runOne(km *kafka.Message) error {
	ctx := p.workCtx
	off := int64(km.TopicPartition.Offset)
	a, ok := p.attempts[off]
	if !ok && off < p.crashedUntil {
		// Attempted by a batch that never committed: the crash counts once.
		a = offsetstore.Attempt{Offset: off, Attempts: 1}
	}
	if p.oversized(km) {
		return p.deadLetter(km, offsetstore.Attempt{Offset: off, ErrorClass: ErrorClassOversized,
			ErrorMessage: fmt.Sprintf("value of %d bytes exceeds MaxValueBytes %d; the handler did not run", len(km.Value), p.c.cfg.MaxValueBytes)})
	}
	max := p.c.cfg.Retry.MaxAttempts
	for {
		if a.ErrorClass == ErrorClassPermanent || a.Attempts >= max {
			return p.deadLetter(km, a)
		}
		if a.Attempts > 0 && a.ErrorClass != "" {
			d := p.c.cfg.Retry.Backoff(a.Attempts)
			p.log.Info("retrying after backoff", zap.Int64("offset", off), zap.Int("attempt", a.Attempts+1), zap.Duration("backoff", d))
			if err := p.waitRetry(d); err != nil {
				return err
			}
			p.c.stats.retries.Add(1)
			p.c.metrics.retries.WithLabelValues(p.c.group, p.tp.Topic).Inc()
		}
		n := a.Attempts + 1
		// Durable before the handler runs: a crash during this try counts (invariant 3).
		for t := 1; ; t++ {
			err := p.c.store.BeginAttempt(ctx, p.c.pool, p.c.group, p.tp, off, n)
			if err == nil {
				break
			}
			if err := p.afterDBError(t, err); err != nil {
				return err
			}
		}
		a.Attempts = n
		a.ErrorClass = "" // unknown until this try ends; a crash leaves it empty
		p.attempts[off] = a
		herr, err := p.oneTx(ctx, km, n)
		for t := 1; err != nil; t++ {
			if err := p.afterDBError(t, err); err != nil {
				return err
			}
			herr, err = p.oneTx(ctx, km, n) // the same try: database trouble is not an attempt
		}
		if herr == nil {
			delete(p.attempts, off)
			return nil
		}
		class, msg, stack := describe(herr)
		p.log.Info("handler failed", zap.Int64("offset", off), zap.Int("attempt", n), zap.String("error_class", class), zap.String("error", dlq.SanitizeText(msg, 512)))
		for t := 1; ; t++ {
			err := p.c.store.RecordFailure(ctx, p.c.pool, p.c.group, p.tp, off, n, class, msg, stack)
			if err == nil {
				break
			}
			if err := p.afterDBError(t, err); err != nil {
				return err
			}
		}
		now := time.Now()
		if a.FirstFailureAt.IsZero() {
			a.FirstFailureAt = now
		}
		a.LastFailureAt, a.ErrorClass, a.ErrorMessage, a.Stack = now, class, msg, stack
		p.attempts[off] = a
	}
}

// oneTx runs one message's try in its own transaction.
func (p *partition) oneTx(ctx context.Context, km *kafka.Message, attempt int) (herr, err error) {
	off := int64(km.TopicPartition.Offset)
	tx, err := p.c.begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	fresh, dups, _, herr, err := p.claim(ctx, tx, toMessages([]*kafka.Message{km}, attempt))
	if err != nil || herr != nil {
		return herr, err
	}
	if err := p.call(ctx, tx, fresh); err != nil {
		if retryableDB(err) || ctx.Err() != nil {
			return nil, err
		}
		var me *MessageError
		if errors.As(err, &me) {
			err = me.Err
		}
		return err, nil
	}
	hook("handled", off)
	if err := p.auditGap(ctx, tx, off); err != nil {
		return nil, err
	}
	if err := p.c.store.DeleteAttempts(ctx, tx, p.c.group, p.tp, off, off+1); err != nil {
		return nil, err
	}
	if err := p.c.store.Advance(ctx, tx, p.c.group, p.tp, p.w, off+1, p.inflightEnd); err != nil {
		return nil, err
	}
	if err := p.commit(ctx, tx, off+1); err != nil {
		return nil, err
	}
	hook("db-committed", off)
	p.committed(off+1, len(fresh), 0)
	p.duplicates(dups)
	return nil, nil
}

// deadLetter writes the dead letter, publishes it through the outbox when configured, and
// advances the watermark past it, all in one transaction (invariant 4).
func (p *partition) deadLetter(km *kafka.Message, a offsetstore.Attempt) error {
	ctx := p.workCtx
	off := int64(km.TopicPartition.Offset)
	now := time.Now()
	d := &dlq.DeadLetter{
		Group: p.c.group, Topic: p.tp.Topic, Partition: p.tp.Partition, Offset: off,
		Key: km.Key, Value: km.Value, Timestamp: km.Timestamp,
		Attempts: a.Attempts, ErrorClass: a.ErrorClass, ErrorMessage: a.ErrorMessage, Stack: a.Stack,
		FirstFailureAt: a.FirstFailureAt, LastFailureAt: a.LastFailureAt, ReplayEpoch: p.epoch,
	}
	for _, h := range km.Headers {
		d.Headers = append(d.Headers, dlq.Header{Key: h.Key, Value: h.Value})
	}
	if d.ErrorClass == "" {
		d.ErrorClass = ErrorClassCrash
		d.ErrorMessage = fmt.Sprintf("the process stopped (crash or kill) while the handler ran; %d attempts did not finish", a.Attempts)
	}
	if d.FirstFailureAt.IsZero() {
		d.FirstFailureAt = now
	}
	if d.LastFailureAt.IsZero() {
		d.LastFailureAt = now
	}
	for t := 1; ; t++ {
		err := p.deadLetterTx(ctx, d, off)
		if err == nil {
			break
		}
		if err := p.afterDBError(t, err); err != nil {
			return err
		}
	}
	delete(p.attempts, off)
	p.c.stats.deadLettered.Add(1)
	p.c.metrics.deadLetters.WithLabelValues(p.c.group, p.tp.Topic, d.ErrorClass).Inc()
	p.log.Warn("message dead-lettered", zap.Int64("offset", off), zap.Int("attempt", d.Attempts),
		zap.String("error_class", d.ErrorClass), zap.String("error", dlq.SanitizeText(d.ErrorMessage, 512)))
	return nil
}

func (p *partition) deadLetterTx(ctx context.Context, d *dlq.DeadLetter, off int64) error {
	tx, err := p.c.begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	id, _, err := dlq.InsertTx(ctx, tx, p.c.cfg.Schema, d)
	if err != nil {
		return err
	}
	if !p.c.cfg.DeadLetter.Disabled {
		// Published through the outbox in this transaction: the dead-letter record exists
		// if and only if the dead letter does (invariant 4). A message failing again after a
		// replay updates its row and is published again.
		d.ID = id
		rec := outbox.DeadLetterRecord(p.c.cfg.DeadLetter.Topic(d.Topic), d)
		if _, err := (outbox.Writer{Schema: p.c.cfg.Schema}).Write(ctx, tx, rec); err != nil {
			return fmt.Errorf("publish dead letter through the outbox: %w", err)
		}
	}
	hook("dead-letter", off)
	if err := p.auditGap(ctx, tx, off); err != nil {
		return err
	}
	if err := p.c.store.DeleteAttempts(ctx, tx, p.c.group, p.tp, off, off+1); err != nil {
		return err
	}
	if err := p.c.store.Advance(ctx, tx, p.c.group, p.tp, p.w, off+1, p.inflightEnd); err != nil {
		return err
	}
	if err := p.commit(ctx, tx, off+1); err != nil {
		return err
	}
	hook("db-committed", off)
	p.committed(off+1, 0, 1)
	return nil
}
