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
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/handlercall"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/pg"
)

// The worker of one assigned partition: its state, its lifecycle (start, stop, fencing) and how
// it cuts what it receives into batches. The transactions themselves are in partition_tx.go;
// attempts, backoff and dead letters in partition_attempts.go.

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
	// skips carries the poll loop's requests to pass offsets without a record
	// (partition_recordless.go).
	skips chan recordless

	// Owned by the poll loop.
	pending []*kafka.Message
	paused  bool

	// The offsets, one name each. watermark is written by the worker (on every commit and
	// refence), dispatchedEnd by the poll loop; both are read from any goroutine.
	watermark     atomic.Int64 // the database watermark: the next offset to process
	dispatchedEnd atomic.Int64 // offsets below were already handed to the worker (or dropped)
	inflightEnd   int64        // worker: the durable marker; offsets [watermark, inflightEnd) are marked attempted
	crashedUntil  int64        // worker: offsets below had a marker when loaded; a crash counts one attempt each

	// Read from any goroutine.
	pendingLen atomic.Int64
	bytes      atomic.Int64 // messageBytes of every message held (queued, kept, in a batch)
	busy       atomic.Int64 // messages the worker holds (in a batch or a backoff)

	// Owned by the worker.
	epoch    int // replay epoch: scopes business idempotency keys
	attempts map[int64]offsetstore.Attempt

	// Owned by the worker: a wait for a dependency the handler reported Unavailable.
	unavailSince   time.Time                        // zero when not waiting
	unavailN       int                              // Unavailable answers since unavailSince
	unavailExpired bool                             // Config.UnavailableMaxWait passed: answers count as attempts
	waiting        atomic.Pointer[WaitingPartition] // set while waiting, for Stats and Readiness

	// Owned by the worker: Config.Backpressure's hold (holdBack).
	heldBack      atomic.Bool // in Config.Backpressure now, for Stats
	backpressWarn time.Time   // its last failure logged (at most one a minute)

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
		skips:       make(chan recordless, 1),
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
	defer p.available(false)
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
		err := p.holdBack()
		if err == nil {
			err = p.process(batch)
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

// holdBack calls Config.Backpressure, if set, before a batch: it returns errStopped when the
// worker was asked to stop while it waited, else nil. The throttle's own error or panic (with
// its stack) is logged, at most once a minute per partition, and the batch runs. A hold longer
// than backpressureNote is logged when it starts to show and when it ends. A throttle that
// ignores its context is left behind once the partition's work is aborted (the shutdown
// timeout, a lost partition): the worker returns, the throttle's goroutine goes on.
func (p *partition) holdBack() error {
	bp := p.c.cfg.Backpressure
	if bp == nil {
		return nil
	}
	ctx, cancel := context.WithCancel(p.workCtx)
	defer cancel()
	go func() {
		select {
		case <-p.stopCh:
			cancel()
		case <-ctx.Done():
		}
	}()
	done := make(chan error, 1)
	go func() {
		done <- func() (err error) {
			defer func() {
				if v := recover(); v != nil {
					err = &handlercall.Panic{Value: v, Stack: debug.Stack(), Of: "Config.Backpressure"}
				}
			}()
			return bp(ctx)
		}()
	}()
	p.heldBack.Store(true)
	defer p.heldBack.Store(false)
	start := time.Now()
	note := time.NewTimer(backpressureNote)
	defer note.Stop()
	noted := false
	var err error
wait:
	for {
		select {
		case err = <-done:
			break wait
		case <-note.C:
			noted = true
			p.log.Info("partition held back by Config.Backpressure", zap.Duration("for", time.Since(start)))
		case <-p.workCtx.Done():
			p.log.Warn("Config.Backpressure did not return after the partition's work was aborted; left behind")
			return errStopped
		}
	}
	if noted {
		p.log.Info("partition no longer held back", zap.Duration("held", time.Since(start)))
	}
	if p.stopping() {
		return errStopped
	}
	if err != nil && time.Since(p.backpressWarn) >= time.Minute {
		p.backpressWarn = time.Now()
		fields := []zap.Field{zap.Error(err)}
		var pe *handlercall.Panic
		if errors.As(err, &pe) {
			fields = append(fields, zap.ByteString("stack", pe.Stack))
		}
		p.log.Warn("Config.Backpressure failed; the batch runs (logged at most once a minute)", fields...)
	}
	return nil
}

// backpressureNote is how long a Config.Backpressure hold lasts before it is logged.
const backpressureNote = 10 * time.Second

// goOn handles the error of one round of the worker (a batch, or passing offsets without a
// record) and reports whether the worker goes on.
func (p *partition) goOn(err error) bool {
	switch {
	case err == nil:
		return true
	case errors.Is(err, errStopped):
		p.clearInflight()
		return false
	case errors.Is(err, offsetstore.ErrFenced):
		return p.refence()
	default:
		// Not expected: the loop's own errors are retried. Stop the consumer rather
		// than leave the partition assigned and unprocessed.
		p.c.fail(fmt.Errorf("partition %s: %w", p.tp, err))
		return false
	}
}

// clearInflight removes the in-flight marker when the worker stops cleanly: the messages it
// covered but never ran are not attempts, so the next owner runs them as a normal batch. A
// worker whose transaction was aborted (lost partition, shutdown timeout) keeps it: its
// handler may have run.
func (p *partition) clearInflight() {
	if p.workCtx.Err() != nil || p.inflightEnd <= p.watermark.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.c.store.MarkInflight(ctx, p.c.pool, p.c.group, p.tp, p.watermark.Load(), p.watermark.Load()); err != nil {
		p.log.Debug("clear the in-flight marker", zap.Error(err))
		return
	}
	p.inflightEnd = p.watermark.Load()
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
	err := p.untilDone(p.watermark.Load(), func() error {
		ws, err := p.c.store.Watermarks(ctx, p.c.pool, p.c.group, []offsetstore.TP{p.tp})
		if err != nil {
			return err
		}
		var ok bool
		if w, ok = ws[p.tp]; !ok {
			return fmt.Errorf("watermark of %s deleted", p.tp)
		}
		atts, err = p.c.store.Attempts(ctx, p.c.pool, p.c.group, p.tp, w.Next)
		return err
	})
	if err != nil {
		return false
	}
	p.c.fenced(p, p.watermark.Load(), w.Next)
	p.inflightEnd, p.attempts, p.epoch = w.InflightEnd, atts, w.ReplayEpoch
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
// before, or it was in flight when a previous owner crashed (docs/design.md: no bisection by
// repeated crashes).
func (p *partition) needsCare(km *kafka.Message) bool {
	offset := int64(km.TopicPartition.Offset)
	if offset < p.crashedUntil || p.oversized(km) {
		return true
	}
	_, ok := p.attempts[offset]
	return ok
}

func (p *partition) oversized(km *kafka.Message) bool {
	return p.c.cfg.MaxValueBytes > 0 && len(km.Value) > p.c.cfg.MaxValueBytes
}

func (p *partition) process(batch []*kafka.Message) error {
	msgs := batch[:0]
	for _, m := range batch {
		if int64(m.TopicPartition.Offset) < p.watermark.Load() {
			p.c.redeliveryDropped(p.tp, 1)
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

// runBatch runs msgs optimistically in one transaction. It returns the index of a message
// whose handler failed (its attempt is recorded and the transaction rolled back),
// unattributed when the batch failed without naming one, or -1 when the batch committed.
func (p *partition) runBatch(msgs []*kafka.Message) (int, error) {
	ctx := p.workCtx
	first := int64(msgs[0].TopicPartition.Offset)
	end := int64(msgs[len(msgs)-1].TopicPartition.Offset) + 1
	if end > p.inflightEnd {
		ahead := p.markAhead(end)
		if err := p.untilDone(first, func() error {
			return p.c.store.MarkInflight(ctx, p.c.pool, p.c.group, p.tp, p.watermark.Load(), ahead)
		}); err != nil {
			return -1, err
		}
		p.inflightEnd = ahead
	}
	failed, herr := -1, error(nil)
	if err := p.untilDone(first, func() (err error) {
		failed, herr, err = p.batchTx(ctx, msgs, end)
		return err
	}); err != nil {
		return -1, err
	}
	switch {
	case herr == nil:
		return -1, nil
	case failed == unattributed:
		p.availableUnless(herr)
		p.log.Info("batch handler failed without naming a message; running the batch one message per transaction",
			zap.Int("messages", len(msgs)), zap.String("error", pg.SanitizeText(herr.Error(), 512)))
		return unattributed, nil
	default:
		p.availableUnless(herr)
		off := int64(msgs[failed].TopicPartition.Offset)
		if err := p.recordFailure(offsetstore.Attempt{Offset: off, Attempts: 1}, herr, "handler failed in a batch; isolating the message"); err != nil {
			return -1, err
		}
		return failed, nil
	}
}

// markAhead is how far the in-flight marker written with a batch ending at end reaches: over
// the messages already dispatched to the worker, at most one batch beyond end. Marking ahead
// spares the next batch its own marker write (it is covered by the previous commit);
// bounding it bounds what a crash costs, since every offset under the marker then runs one
// message per transaction (docs/design.md, "No bisection by crashing"). Unbounded, a crash with 25,000 messages dispatched per
// partition cost about 45 s of one-per-transaction recovery.
func (p *partition) markAhead(end int64) int64 {
	return max(end, min(p.dispatchedEnd.Load(), end+int64(p.c.cfg.Batch.Size)))
}
