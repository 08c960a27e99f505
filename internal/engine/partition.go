package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/offsetstate"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/internal/parking"
)

// The worker of one assigned partition: its collaborators, its state and its lifecycle
// (start, stop, fencing). What it does with a message is in executor.go; its waits in
// waits.go.

var errStopped = errors.New("partition worker stopped")

// worker runs one assigned partition's messages in offset order; each batch runs in one
// transaction that also advances the watermark.
type worker struct {
	// The loop's collaborators, the same for every worker of a Loop, which owns them
	// (Loop.newWorker copies them).
	group   string
	set     *Settings
	pool    *pgxpool.Pool                                     // the offset store's statements outside a transaction
	store   *offsetstore.Store                                // watermarks, markers, attempts, audit rows
	begin   func(context.Context) (pgx.Tx, error)             // Loop.begin: a loop transaction (Settings.BeginSQL)
	body    Runner                                            // the transaction body (Body)
	emit    Emitter                                           // counted events
	commits *committer                                        // the Kafka commit after the database commit: the client's the worker started under
	logEnds func(offsetstore.TP) (low, high int64, err error) // Loop.logEnds: the partition's log range, cached by librdkafka
	resyncs chan<- resyncRequest                              // Loop.resyncs: asks the poll loop to drop and seek a fenced partition
	fail    func(error)                                       // Loop.fail: stops the consumer with an unexpected error
	breaker *Breaker                                          // shared failures across partitions (breaker.go)
	units   chan struct{}                                     // process-wide unit slots (Settings.MaxUnits); nil: no cap
	gate    *gate                                             // a probe's turn to run alone in the process (isolate.go)
	// The Loop's state a worker writes or reads.
	lastCommit *atomic.Int64                         // Loop.lastCommit: the worker stores the time of each database commit
	db         *atomic.Pointer[offsetstate.Database] // Loop.db: the database's identity as the rollback check last read it

	tp    offsetstore.TP
	log   *zap.Logger
	in    chan *kafka.Message
	skips chan recordless // the poll loop's requests to pass offsets without a record (recordless.go)
	waits *waits          // the worker's own waits (its database work, and the serial lane's)
	// serial is the worker's one lane with Concurrency 1: it runs every message in offset order
	// and its transactions advance the watermark themselves.
	serial *lane

	// The offsets, one name each. watermark is written by the worker (on every commit and
	// refence), dispatchedEnd by the poll loop; both are read from any goroutine.
	watermark     atomic.Int64 // the database watermark: the next offset to process
	dispatchedEnd atomic.Int64 // offsets below were already handed to the worker (or dropped)
	inflightEnd   int64        // worker: the durable marker; offsets [watermark, inflightEnd) are marked attempted
	sus           suspect      // worker: the offsets under the marker when loaded, run in pieces (isolate.go)
	doneRowsTo    int64        // worker: one past the doneAbove offsets the serial lane passed (0: none); its commits delete their rows

	// Read from any goroutine.
	lanes atomic.Pointer[[]*lane] // the lanes of the current round (Concurrency > 1), for Stats
	bytes atomic.Int64            // messageBytes of every message held (queued, kept, in a batch)
	busy  atomic.Int64            // messages the worker holds (in a batch or a backoff)

	// Owned by the worker.
	epoch int // replay epoch: scopes business idempotency keys
	// logID is the topic id of the log the watermark is in ("" unknown): it scopes the outbox
	// ids derived from the input (sourceScope), not the business keys (scope).
	logID string
	// logCluster is the cluster id of that log ("" unknown), for movedAway's report.
	logCluster string
	// doneAbove are offsets above the watermark already applied (store.Done), left by units
	// that committed out of order (Concurrency > 1): they are skipped, never run again.
	doneAbove map[int64]bool
	// parked are the partition's parked keys' counts (Settings.ParkKeys, park.go; nil when
	// off), parkStore their table.
	parked    *parkedKeys
	parkStore *parking.Store

	attMu    sync.Mutex // guards attempts: the lanes of one partition share it
	attempts map[int64]offsetstore.Attempt

	startedAt int64 // the watermark the worker started at (the assignment checked the log there)

	stopOnce  sync.Once
	stopCh    chan struct{} // closed: finish the current transaction and return
	workCtx   context.Context
	abortWork context.CancelFunc // cancels in-flight handler and database calls
	done      chan struct{}
}

// newWorker returns the worker of tp, starting at watermark w with the attempt rows atts and
// the offsets done above it (done), with the loop's collaborators; it works once started (go
// run).
func (l *Loop) newWorker(tp offsetstore.TP, w offsetstore.Watermark, atts map[int64]offsetstore.Attempt, done []int64, parked map[string]int) *worker {
	ctx, cancel := context.WithCancel(context.Background())
	sh := l.shardOf(tp)
	p := &worker{
		group: l.group, set: l.set, pool: sh.pool, store: l.store, begin: l.beginOn(sh.pool), body: l.body, emit: l.emit,
		commits: l.commits, logEnds: l.logEnds, resyncs: l.resyncs, fail: l.fail,
		breaker: l.breaker, units: l.units, gate: l.gate,
		lastCommit: &l.lastCommit, db: &sh.db,

		tp:          tp,
		log:         l.log.With(zap.String("topic", tp.Topic), zap.Int32("partition", tp.Partition)),
		in:          make(chan *kafka.Message, 2*l.set.BatchSize),
		skips:       make(chan recordless, 1),
		inflightEnd: w.InflightEnd,
		epoch:       w.ReplayEpoch,
		logID:       w.TopicID,
		logCluster:  w.ClusterID,
		attempts:    atts,
		stopCh:      make(chan struct{}),
		workCtx:     ctx,
		abortWork:   cancel,
		done:        make(chan struct{}),
	}
	p.waits = &waits{p: p, stop: p.stopCh}
	p.serial = &lane{p: p, waits: p.waits, mode: serialMode{}}
	p.setDoneAbove(done)
	if l.set.ParkKeys {
		p.parked, p.parkStore = newParkedKeys(parked), l.parkStore
	}
	if w.InflightEnd > w.Next {
		p.sus = newSuspect(w.Next, w.InflightEnd)
		p.log.Warn("a batch was in flight when the last owner stopped; its offsets run in pieces, each its own marked batch, to find a message that crashes the process",
			zap.Int64("from", w.Next), zap.Int64("to", w.InflightEnd), zap.Int64("piece", p.sus.size))
	}
	p.dispatchedEnd.Store(w.Next)
	p.watermark.Store(w.Next)
	p.startedAt = w.Next
	if p.commits != nil {
		p.commits.setEpoch(tp, w.ReplayEpoch)
	}
	return p
}

func (p *worker) ktp() kafka.TopicPartition {
	t := p.tp.Topic
	return kafka.TopicPartition{Topic: &t, Partition: p.tp.Partition}
}

func (p *worker) stopping() bool {
	select {
	case <-p.stopCh:
		return true
	default:
		return false
	}
}

// requestStop asks the worker to finish its current transaction and return. When lost, or
// when the shutdown timeout passes, in-flight work is aborted.
func (p *worker) requestStop(lost bool) {
	p.stopOnce.Do(func() {
		close(p.stopCh)
		if lost {
			p.abortWork()
			return
		}
		t := time.AfterFunc(p.set.ShutdownTimeout, func() {
			p.log.Warn("shutdown timeout: aborting the in-flight transaction", zap.Duration("timeout", p.set.ShutdownTimeout))
			p.abortWork()
		})
		go func() { <-p.done; t.Stop() }()
	})
}

// wait waits for the worker to return. Once its work is aborted (lost, or the shutdown
// timeout passed) it waits at most Settings.CloseTimeout more, then abandons the worker
// (stuck.go): a handler that ignores its context never holds the partition or the shutdown.
func (p *worker) wait() {
	select {
	case <-p.done:
		return
	case <-p.workCtx.Done():
	}
	t := time.NewTimer(p.set.CloseTimeout)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		p.abandon()
	}
}

func (p *worker) stopAndWait(lost bool) {
	p.requestStop(lost)
	p.wait()
}

// goOn handles the error of one round of the worker (a batch, or passing offsets without a
// record) and reports whether the worker goes on.
func (p *worker) goOn(err error) bool {
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
		p.fail(fmt.Errorf("partition %s: %w", p.tp, err))
		return false
	}
}

// clearInflight removes the in-flight marker when the worker stops cleanly: the messages it
// covered but never ran are not attempts, so the next owner runs them as a normal batch. A
// worker whose transaction was aborted (lost partition, shutdown timeout) keeps it: its
// handler may have run.
func (p *worker) clearInflight() {
	if p.workCtx.Err() != nil || p.inflightEnd <= p.watermark.Load() || p.sus.holds(p.watermark.Load()) {
		return // in a suspect range the marker is the piece that may crash: the next owner needs it
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.store.MarkInflight(ctx, p.pool, p.group, p.tp, p.logID, p.watermark.Load(), p.watermark.Load()); err != nil {
		p.log.Debug("clear the in-flight marker", zap.Error(err))
		return
	}
	p.inflightEnd = p.watermark.Load()
}

// refence reloads the partition's state after a fenced watermark update and asks the poll
// loop to drop what it holds and seek to the database watermark. It reports whether the
// worker should go on.
func (p *worker) refence() bool {
	ctx := p.workCtx
	p.log.Warn("watermark fenced: another consumer advanced it; re-reading the database watermark")
	var w offsetstore.Watermark
	var atts map[int64]offsetstore.Attempt
	var done []int64
	var counts map[string]int
	var gen uint64
	if p.parked != nil {
		gen, _ = p.parked.snapshot()
	}
	moved := false
	err := p.waits.untilDone(p.watermark.Load(), func() error {
		ws, err := p.store.Watermarks(ctx, p.pool, p.group, []offsetstore.TP{p.tp})
		if err != nil {
			return err
		}
		var ok bool
		if w, ok = ws[p.tp]; !ok && p.set.Placer != nil {
			moved = true // a shard move took the partition's state to another shard (shards.go)
			return nil
		} else if !ok {
			return fmt.Errorf("watermark of %s deleted", p.tp)
		}
		if atts, err = p.store.Attempts(ctx, p.pool, p.group, p.tp, w.Next); err != nil {
			return err
		}
		if done, err = p.store.Done(ctx, p.pool, p.group, p.tp, w.Next); err != nil || p.parked == nil {
			return err
		}
		counts, err = p.parkStore.Counts(ctx, p.pool, p.group, p.tp.Topic, p.tp.Partition)
		return err
	})
	if err != nil {
		return false
	}
	if moved {
		p.replace()
		return false
	}
	if p.logID != "" && w.TopicID != "" && w.TopicID != p.logID {
		p.movedAway(w)
		return false
	}
	old := p.watermark.Load()
	p.emit.Fenced(p.tp, old, w.Next)
	if w.Next < old {
		// Nobody moves a watermark back under a running consumer (offsets reset refuses while
		// the group has members): the database lost transactions (rollback.go).
		p.rolledBack(old, w.Next)
		p.commits.reset(p.tp, w.Next)
	}
	p.commits.setEpoch(p.tp, w.ReplayEpoch)
	p.attMu.Lock()
	p.attempts = atts
	p.attMu.Unlock()
	p.inflightEnd, p.epoch, p.logID = w.InflightEnd, w.ReplayEpoch, w.TopicID
	p.setDoneAbove(done)
	if p.parked != nil {
		p.parked.reconcile(gen, counts) // another owner may have parked keys meanwhile
	}
	if w.InflightEnd > w.Next {
		p.sus = newSuspect(w.Next, w.InflightEnd)
	} else {
		p.sus = suspect{}
	}
	p.watermark.Store(w.Next)
	r := resyncRequest{p: p, at: w.Next, done: make(chan struct{})}
	select {
	case p.resyncs <- r:
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

// scope is the idempotency scope of the partition's group and replay epoch.
func (p *worker) scope() string { return ScopesOf(p.group, p.epoch, "").Claims }

// scopes are the partition's idempotency scope and the scope of the outbox ids derived from
// its messages: "group/epoch" and "group/epoch/topic id" (the log's topic id, so that after a
// topic recreated and adopted the new log's message at a reused offset gets event ids of its
// own, while a business key claimed in the old log still counts: docs/offsets.md).
func (p *worker) scopes() Scopes { return ScopesOf(p.group, p.epoch, p.logID) }

// messageBytes is what a held message counts against Config.MaxBufferedBytes: its key,
// value and headers plus a fixed 256 bytes for the structures around them.
func messageBytes(m *kafka.Message) int64 {
	n := int64(256 + len(m.Key) + len(m.Value))
	for _, h := range m.Headers {
		n += int64(len(h.Key) + len(h.Value))
	}
	return n
}

func (p *worker) setDoneAbove(done []int64) {
	p.doneAbove = make(map[int64]bool, len(done))
	for _, o := range done {
		p.doneAbove[o] = true
	}
}

func (p *worker) attempt(offset int64) (offsetstore.Attempt, bool) {
	p.attMu.Lock()
	defer p.attMu.Unlock()
	a, ok := p.attempts[offset]
	return a, ok
}

func (p *worker) setAttempt(offset int64, a offsetstore.Attempt) {
	p.attMu.Lock()
	defer p.attMu.Unlock()
	p.attempts[offset] = a
}

func (p *worker) dropAttempt(offset int64) {
	p.attMu.Lock()
	defer p.attMu.Unlock()
	delete(p.attempts, offset)
}

// lane runs messages of one partition in offset order, one unit (transaction) at a time:
// the worker's serial lane (Concurrency 1), or one of Concurrency lanes (lanes.go), each
// with its own waits, so a message in backoff holds only its lane. Its mode (mode.go) is
// what the two differ in.
type lane struct {
	p     *worker     // the partition's worker: its offsets, attempts, collaborators
	call  handlerCall // the handler call in progress (stuck.go)
	alone bool        // the lane holds the process's gate (a piece of a narrowed suspect range, isolate.go)
	waits *waits
	mode  mode
	idx   int
	q     laneQueue // lanes.go; unused by the serial lane
	// blockedWarned: the lane logged that Settings.ParkMaxKeys refused to park its message.
	blockedWarned bool
	// toPark: messages of this lane's current run that answered Unavailable inside a batch,
	// parked when they run alone next (park.go).
	toPark map[int64]parkCause
}

// movedAway stops the consumer when the partition's watermark row, read back after a
// refused compare-and-set, counts another log than the one this worker reads (w.TopicID is
// not p.logID): another consumer moved it there while this one ran (AdoptLog: a consumer of
// another cluster behind the same group and topic name, which Kafka's group does not show
// to this one, or `kafkatx offsets reset --mode adopt`). Going on — seeking this worker's
// log to the other log's offset, as a plain fence does — would apply records of this log
// under offsets that now mean the other's, and the two consumers would fence each other
// back and forth. Nothing of this log was applied under the other's offsets: every
// compare-and-set names the worker's log (offsetstore.inLog). The halt is audited and
// reported as a *kafkatx.LogChangedError with MovedAway.
func (p *worker) movedAway(w offsetstore.Watermark) {
	c := offsetstate.LogChange{Recorded: offsetstate.LogID{Cluster: w.ClusterID, Topic: w.TopicID},
		Current: offsetstate.LogID{Cluster: p.logCluster, Topic: p.logID}, Topic: true}
	e := p.set.Halt(Halt{State: string(offsetstate.LogChanged), Group: p.group, Topic: p.tp.Topic, Partition: p.tp.Partition,
		Watermark: w.Next, Committed: -1, LogStart: -1, LogEnd: -1, LogChange: c, MovedAway: true})
	p.log.Error("the watermark was moved onto another log while this consumer ran (another consumer adopted it); stopping",
		zap.String("state", string(offsetstate.LogChanged)), zap.Int64("watermark", w.Next), zap.Int64("this_consumer_at", p.watermark.Load()),
		zap.String("watermark_topic_id", w.TopicID), zap.String("watermark_cluster_id", w.ClusterID), zap.String("topic_id", p.logID))
	_, _ = p.store.InsertEvent(context.WithoutCancel(p.workCtx), p.pool, offsetstore.Event{Group: p.group, Topic: p.tp.Topic, Partition: p.tp.Partition,
		Kind: offsetstore.KindHalt, From: p.watermark.Load(), To: w.Next, Actor: "kafkatx.consumer",
		Reason: fmt.Sprintf("the watermark was moved onto another log while this consumer ran (topic id %s, this consumer's %s); stopped; nothing of this consumer's log applied under it", w.TopicID, p.logID)})
	p.emit.LogChanged(p.tp, c, false)
	p.fail(&halted{err: e})
}
