// Package engine is kafkatx's consumer loop: the poll loop (loop.go), reconciliation and
// rebalances (rebalance.go), one worker per assigned partition (partition.go) whose path
// from a polled record to the Kafka commit reads top to bottom in executor.go, the waits in
// waits.go, and the transaction body (body.go, call.go) that the test kit kafkatxtest runs
// too. Package kafkatx is its public face: it turns the user's Config into Settings, the
// user's handler into a Body, and implements the Emitter.
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

// Loop is one consumer's poll loop and its partition workers. Create one with New and run it
// once with Run.
type Loop struct {
	// The consumer's collaborators, set by New; each worker gets them (newWorker).
	group   string
	set     *Settings
	log     *zap.Logger
	pool    *pgxpool.Pool      // the offset store's statements outside a transaction (the home shard's)
	home    *shard             // the shard of pool: every partition's without Settings.Placer (shards.go)
	store   *offsetstore.Store // watermarks, markers, attempts, audit rows
	body    Runner             // the transaction body (Body)
	emit    Emitter            // counted events
	breaker *Breaker           // shared failures across partitions (breaker.go)
	units   chan struct{}      // process-wide unit slots (Settings.MaxUnits); nil: no cap
	gate    *gate              // a probe's turn to run alone in the process (isolate.go)

	parkStore *parking.Store // the parked keys (Settings.ParkKeys, park.go)

	failed        atomic.Pointer[error] // first error of a worker that stops the consumer (fail)
	lastMessage   atomic.Int64          // unix nanos of the last polled record
	lastCommit    atomic.Int64          // unix nanos of the last database commit; the workers store it
	firstAssigned atomic.Int64          // unix nanos of the first assignment

	// Owned by Run. kc and commits are the current Kafka client's (openClient; a rejoin
	// replaces them).
	kc      *kafka.Consumer
	commits *committer // the Kafka commit after the database commit
	mu      sync.Mutex // guards parts for Snapshot
	parts   map[offsetstore.TP]*fetch
	resyncs chan resyncRequest // fenced workers ask the poll loop to drop and seek their partition (resync)
	fatal   error
	eager   bool

	// knownTopics: the topics the group had a watermark on when the current assignment's
	// reconciliation began (rebalance.go); the poll goroutine's only.
	knownTopics map[string]bool
	// recordedLog is the log each assigned partition's watermark is in, as reconciled at its
	// assignment (identity.go); guarded by mu (watchLogs reads it).
	recordedLog map[offsetstore.TP]offsetstate.LogID

	placeMu    sync.Mutex                   // guards shards and placed
	shards     map[*pgxpool.Pool]*shard     // the shards partitions were placed on (shards.go)
	placed     map[offsetstore.TP]*shard    // each assigned partition's shard (Loop.place)
	placements map[offsetstore.TP]Placement // each assigned partition's placement as the Placer gave it

	health    health        // what Readiness reports
	probeWake chan struct{} // wakes the topic probe
}

// fetch is the poll loop's state of one assigned partition: its worker, and what the poll
// loop holds for it while the worker's queue is full. Owned by the poll loop's goroutine,
// except pendingLen.
type fetch struct {
	w          *worker
	pending    []*kafka.Message
	paused     bool
	pendingLen atomic.Int64
	stall      stall // the stall watchdog's view (stall.go)
}

// inFlight counts the partition's messages not yet committed: queued, kept, or held by the
// worker.
func (f *fetch) inFlight() int {
	return len(f.w.in) + int(f.pendingLen.Load()) + int(f.w.busy.Load())
}

// New returns a Loop that runs body for set's topics with pool, reporting to emit.
func New(pool *pgxpool.Pool, body Runner, set *Settings, emit Emitter) *Loop {
	l := &Loop{
		group: set.Group, set: set, pool: pool, store: offsetstore.New(set.Schema), body: body, emit: emit,
		parkStore:   parking.New(set.Schema),
		log:         set.Logger.With(zap.String("group", set.Group)),
		gate:        newGate(),
		parts:       map[offsetstore.TP]*fetch{},
		recordedLog: map[offsetstore.TP]offsetstate.LogID{},
		probeWake:   make(chan struct{}, 1),
		home:        &shard{pool: pool},
		shards:      map[*pgxpool.Pool]*shard{},
		placed:      map[offsetstore.TP]*shard{},
		placements:  map[offsetstore.TP]Placement{},
	}
	l.shards[pool] = l.home
	l.breaker = newBreaker(set.BreakerThreshold, set.BreakerProbe, set.UnavailableMaxWait, l.log, emit.BreakerChanged)
	if set.MaxUnits > 0 {
		l.units = make(chan struct{}, set.MaxUnits)
	}
	return l
}

// begin opens a loop transaction (Settings.BeginSQL) on tp's shard.
func (l *Loop) begin(ctx context.Context, tp offsetstore.TP) (pgx.Tx, error) {
	return l.beginOn(l.poolOf(tp))(ctx)
}

// fail stops the consumer with err, an unexpected error of a worker: Run returns the first
// one, prefixed "kafkatx: ".
func (l *Loop) fail(err error) {
	err = fmt.Errorf("kafkatx: %w", err)
	l.failed.CompareAndSwap(nil, &err)
}

// logEnds is tp's log range [low, high) as the current client's librdkafka last cached it.
func (l *Loop) logEnds(tp offsetstore.TP) (low, high int64, err error) {
	return l.kc.GetWatermarkOffsets(tp.Topic, tp.Partition)
}

// Run joins the consumer group and processes messages until ctx is cancelled or a fatal
// error occurs (kafkatx.Consumer.Run documents the steps and the errors). A halt of
// reconciliation is returned as Settings.Halt made it.
func (l *Loop) Run(ctx context.Context) error {
	km := l.set.Kafka
	var logs chan kafka.LogEvent
	if l.set.RouteLogs {
		km = kafka.ConfigMap{}
		for k, v := range l.set.Kafka {
			km[k] = v
		}
		logs = make(chan kafka.LogEvent, 1000)
		km["go.logs.channel.enable"], km["go.logs.channel"] = true, logs
	}
	quitAux := make(chan struct{}) // stops the log router
	var aux sync.WaitGroup
	if logs != nil {
		aux.Add(1)
		go func() { defer aux.Done(); l.routeLogs(logs, quitAux) }()
	}
	stopAux := func() { close(quitAux); aux.Wait() }
	l.resyncs = make(chan resyncRequest, 16)
	cl, err := l.openClient(ctx, km)
	if err != nil {
		stopAux()
		return err
	}
	l.health.set(func(h *health) { h.running = true })
	l.log.Info("consumer started", zap.Strings("topics", l.set.Topics),
		zap.Int("batch_size", l.set.BatchSize), zap.Int("max_attempts", l.set.MaxAttempts))

	lagTick := time.NewTicker(time.Second)
	defer lagTick.Stop()
	var rollbackCheck atomic.Bool // a check is running (rollback.go)
	nextRollbackCheck := time.Now().Add(rollbackCheckEvery)
	for ctx.Err() == nil && l.fatal == nil {
		if errp := l.failed.Load(); errp != nil {
			l.fatal = *errp
			break
		}
		pollMs := 50
		if l.servicePartitions() {
			pollMs = 1 // workers are being fed from memory: come back soon
		}
		select {
		case <-lagTick.C:
			l.updateLag()
			l.checkStuck()
			l.checkJoined() // KIP-848: a member with no partitions gets no callback
			l.passRecordless()
			if time.Now().After(nextRollbackCheck) {
				nextRollbackCheck = time.Now().Add(rollbackCheckEvery)
				l.checkRollbacks(&rollbackCheck)
			}
		default:
		}
		switch e := l.kc.Poll(pollMs).(type) {
		case *kafka.Message:
			l.dispatch(e)
		case kafka.Error:
			if err := l.onKafkaError(e); err != nil {
				if f := (*fencedMember)(nil); errors.As(err, &f) {
					cl, err = l.rejoin(ctx, km, cl, f)
				}
				l.fatal = err
			}
		}
	}
	if l.fatal != nil {
		l.health.set(func(h *health) {
			if h.fatal == nil {
				h.fatal = l.fatal
			}
		})
	}
	l.log.Info("consumer stopping", zap.NamedError("cause", l.fatal))
	// Stop every worker (in-flight transactions finish within the shutdown timeout), then
	// commit their final watermarks to Kafka before leaving the group.
	l.revokeAll(false)
	if cl != nil {
		cl.close(l, l.set.CloseTimeout)
	}
	stopAux()
	l.health.set(func(h *health) { h.running, h.joined = false, false })
	l.log.Info("consumer stopped")
	return l.fatal
}

// bufferShare is each assigned partition's part of Config.MaxBufferedBytes, in bytes. A
// per-partition share keeps a partition whose worker is in a long backoff from pausing the
// others: only it stops fetching.
func (l *Loop) bufferShare() int64 {
	return int64(l.set.MaxBufferedBytes) / int64(max(1, len(l.parts)))
}

// servicePartitions moves kept messages into worker queues, resumes paused partitions that
// hold half their share of Config.MaxBufferedBytes or less, and serves resync requests from
// fenced workers. It reports whether messages are still kept, so the poll loop comes back
// quickly to feed the workers.
func (l *Loop) servicePartitions() (kept bool) {
	for {
		select {
		case r := <-l.resyncs:
			l.resync(r)
			continue
		default:
		}
		break
	}
	share := l.bufferShare()
	for _, f := range l.parts {
		p := f.w
		n := 0
	feed:
		for n < len(f.pending) {
			select {
			case p.in <- f.pending[n]:
				f.pending[n] = nil
				n++
			default:
				break feed
			}
		}
		if n > 0 {
			f.pending = f.pending[n:]
			if len(f.pending) == 0 {
				f.pending = nil
			}
			f.pendingLen.Store(int64(len(f.pending)))
		}
		kept = kept || len(f.pending) > 0
		if f.paused && p.bytes.Load() <= share/2 {
			if err := l.kc.Resume([]kafka.TopicPartition{p.ktp()}); err != nil {
				l.log.Warn("resume partition", zap.String("topic", p.tp.Topic), zap.Int32("partition", p.tp.Partition), zap.Error(err))
				continue
			}
			f.paused = false
		}
	}
	return kept
}

type resyncRequest struct {
	p    *worker
	at   int64
	done chan struct{}
	// replace: the partition's state left the worker's shard (a shard move): the poll loop
	// places it again and starts a new worker there (Loop.replace); the old one has returned.
	replace bool
}

// resync drops everything kept in memory for a fenced partition and seeks it to the
// watermark the worker re-read from the database.
func (l *Loop) resync(r resyncRequest) {
	defer close(r.done)
	if r.replace {
		l.replace(r.p)
		return
	}
	p := r.p
	f := l.parts[p.tp]
	if f == nil || f.w != p {
		return
	}
	for _, m := range f.pending {
		p.bytes.Add(-messageBytes(m))
	}
	f.pending = nil
	f.pendingLen.Store(0)
	for len(p.in) > 0 {
		p.bytes.Add(-messageBytes(<-p.in))
	}
	p.dispatchedEnd.Store(r.at)
	tp := p.ktp()
	tp.Offset = kafka.Offset(r.at)
	if _, err := l.kc.SeekPartitions([]kafka.TopicPartition{tp}); err != nil {
		l.log.Warn("seek after fence", zap.String("topic", p.tp.Topic), zap.Int32("partition", p.tp.Partition), zap.Int64("offset", r.at), zap.Error(err))
	}
	if f.paused {
		if err := l.kc.Resume([]kafka.TopicPartition{p.ktp()}); err == nil {
			f.paused = false
		}
	}
}

func (l *Loop) updateLag() {
	for tp, f := range l.parts {
		_, high, err := l.kc.GetWatermarkOffsets(tp.Topic, tp.Partition)
		if err != nil || high < 0 {
			l.checkStalled(tp, f, -1)
			continue
		}
		l.emit.PartitionLag(tp, f.w.watermark.Load(), high)
		l.checkStalled(tp, f, high)
	}
}

// Snapshot is what Stats and Readiness read of the assigned partitions.
type Snapshot struct {
	Assigned, InFlight, HeldBack int
	Waiting                      []Waiting
	Breaker                      *BreakerState // nil unless the breaker is open
	Stuck                        []Stuck       // handler calls running past Settings.StuckAfter
	Stalled                      []Stalled     // partitions with lag and no progress for Settings.StallAfter
	BackpressureFailing          []BackpressureFailure
	LastMessage, LastCommit      time.Time
	FirstAssigned                time.Time
}

// Snapshot returns the loop's current partitions. Safe from any goroutine.
func (l *Loop) Snapshot() Snapshot {
	s := Snapshot{LastMessage: unixNano(l.lastMessage.Load()), LastCommit: unixNano(l.lastCommit.Load()),
		FirstAssigned: unixNano(l.firstAssigned.Load()), Breaker: l.breaker.State()}
	l.mu.Lock()
	defer l.mu.Unlock()
	s.Assigned = len(l.parts)
	s.Stuck = l.stuckNow()
	s.Stalled = l.stalledNow()
	for _, f := range l.parts {
		// Parked messages (park.go) count too, so a parked key keeps the consumer from looking
		// idle; not in inFlight, which decides whether offsets without a record may be passed.
		s.InFlight += f.inFlight() + f.w.parked.messages()
		ws := []*waits{f.w.waits}
		if lanes := f.w.lanes.Load(); lanes != nil {
			for _, u := range *lanes {
				ws = append(ws, u.waits)
			}
		}
		held, waiting, bpFail := false, (*Waiting)(nil), (*BackpressureFailure)(nil)
		for _, w := range ws {
			held = held || w.heldBack.Load()
			if x := w.backpressFail.Load(); x != nil && (bpFail == nil || x.Since.Before(bpFail.Since)) {
				bpFail = x
			}
			if x := w.waiting.Load(); x != nil && (waiting == nil || x.Offset < waiting.Offset) {
				waiting = x
			}
		}
		if held {
			s.HeldBack++
		}
		if waiting != nil {
			s.Waiting = append(s.Waiting, *waiting)
		}
		if bpFail != nil {
			s.BackpressureFailing = append(s.BackpressureFailing, *bpFail)
		}
	}
	return s
}

func unixNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// Halt describes a partition on which reconciliation halts the consumer: its watermark is
// past the log end (State watermark_past_log_end), or Kafka's committed offset is ahead of it
// under the halt policy (kafka_ahead). Settings.Halt turns it into the error Run returns
// (*kafkatx.LogRangeError, *kafkatx.OffsetAheadError).
type Halt struct {
	State            string
	Group, Topic     string
	Partition        int32
	Watermark        int64
	Committed        int64
	LogStart, LogEnd int64
	// LogChange is set when State is offsetstate.LogChanged: the recorded and current ids.
	LogChange offsetstate.LogChange
	// Running is set when the running log check found the change (State LogChanged): the
	// records [AppliedFrom, Watermark) were applied after the last check that still saw the
	// old log, so some of them may be the new log's (none when AppliedFrom == Watermark).
	// Found at an assignment or by a rewound fetch, nothing of the new log was applied.
	Running     bool
	AppliedFrom int64
	// MovedAway is set when the worker found its watermark row moved onto another log (a
	// refused compare-and-set, then the row read back: movedAway): LogChange.Recorded is the
	// row's log now, LogChange.Current the worker's own.
	MovedAway bool
}

// halted marks the error of a Halt, which ends Run instead of being retried.
type halted struct{ err error }

func (e *halted) Error() string { return e.err.Error() }
func (e *halted) Unwrap() error { return e.err }
