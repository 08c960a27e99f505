package engine

import (
	"errors"
	"hash/fnv"
	"sort"
	"sync"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// Per-key concurrency (Settings.Concurrency = N > 1): a partition's messages run in N fixed
// lanes, lane = FNV-1a(key) mod N (a record without a key: its offset mod N), so one key's
// messages run in offset order in one lane while other lanes run other keys. Each lane runs
// its messages as the serial worker does (optimistic batches of its own messages, a failing
// message isolated, attempts, backoff, dead letters), in units of its own transactions; a
// message in backoff holds only its lane. A unit's transaction records its offsets in
// done_offsets, fenced on the watermark (offsetstore.Store.MarkDoneXID, laneMode.finish in mode.go), instead of moving the
// watermark; the worker's coordinator (this goroutine) moves the watermark to the lowest
// offset not done in any lane, deletes the done rows below it in the same transaction, and
// hands it to the Kafka committer. After a crash the offsets in done_offsets are skipped, so
// nothing is applied twice whatever N was; N may change between runs.

// laneDone is a lane's report: a unit's offsets committed, or the error that stopped it.
type laneDone struct {
	offsets []int64
	err     error
}

// laneQueue is a lane's queue of messages, unbounded: the messages count against
// Config.MaxBufferedBytes, which pauses the partition's fetch.
type laneQueue struct {
	mu   sync.Mutex
	msgs []*kafka.Message
	wake chan struct{}
}

func (q *laneQueue) push(m *kafka.Message) {
	q.mu.Lock()
	q.msgs = append(q.msgs, m)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// take waits for messages and returns up to n of them, or nil when stop is closed.
func (q *laneQueue) take(n int, stop <-chan struct{}) []*kafka.Message {
	for {
		q.mu.Lock()
		if len(q.msgs) > 0 {
			k := min(n, len(q.msgs))
			out := append([]*kafka.Message(nil), q.msgs[:k]...)
			q.msgs = q.msgs[k:]
			q.mu.Unlock()
			return out
		}
		q.mu.Unlock()
		select {
		case <-q.wake:
		case <-stop:
			return nil
		}
	}
}

// drain empties the queue and returns what it held.
func (q *laneQueue) drain() []*kafka.Message {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := q.msgs
	q.msgs = nil
	return out
}

// LaneOf is the lane of a record with key at offset among n lanes: FNV-1a of the key — not the
// partitioner's murmur2 (nor CRC32), which would put one partition's keys into a fraction of
// its lanes — or, for a nil key, the offset (nil keys are spread and have no order among
// themselves).
func LaneOf(key []byte, offset int64, n int) int {
	if n <= 1 {
		return 0
	}
	if key == nil {
		return int(offset % int64(n))
	}
	h := fnv.New32a()
	_, _ = h.Write(key)
	return int(h.Sum32() % uint32(n))
}

// tracker holds the offsets dispatched to lanes in offset order and which are done; low is
// the watermark they allow: the lowest offset not done, or past the last one.
type tracker struct {
	offs []int64
	done []bool
	end  int64 // one past the last offset popped (all done below)
}

func (t *tracker) push(o int64, done bool) {
	t.offs = append(t.offs, o)
	t.done = append(t.done, done)
}

func (t *tracker) complete(offs []int64) {
	for _, o := range offs {
		if i := sort.Search(len(t.offs), func(i int) bool { return t.offs[i] >= o }); i < len(t.offs) && t.offs[i] == o {
			t.done[i] = true
		}
	}
}

func (t *tracker) low() int64 {
	n := 0
	for n < len(t.offs) && t.done[n] {
		t.end = t.offs[n] + 1
		n++
	}
	if n > 0 {
		t.offs, t.done = t.offs[n:], t.done[n:]
	}
	if len(t.offs) > 0 {
		return t.offs[0]
	}
	return t.end
}

// runLanes is the worker's goroutine with Concurrency > 1, or while offsets done out of order
// are left above the watermark: rounds of lanes until the worker stops, is fenced for good or
// fails.
func (p *worker) runLanes() {
	defer close(p.done)
	defer p.abortWork()
	defer p.waits.available(false)
	n := max(1, p.set.Concurrency)
	for {
		if !p.goOn(p.laneRound(n)) {
			return
		}
	}
}

// laneRound starts n lanes and coordinates them until the worker is asked to stop or a lane
// (or the coordinator's own database work) fails or is fenced. It then stops the lanes — each
// finishes its unit in flight — records what they committed, moves the watermark over it
// unless fenced or aborted, drops what they did not run, and returns the error.
func (p *worker) laneRound(n int) error {
	stop := make(chan struct{})
	comp := make(chan laneDone, 4*n)
	lanes := make([]*lane, n)
	var wg sync.WaitGroup
	for i := range lanes {
		u := &lane{p: p, waits: &waits{p: p, stop: stop}, idx: i, mode: laneMode{comp: comp}}
		u.q.wake = make(chan struct{}, 1)
		lanes[i] = u
	}
	p.lanes.Store(&lanes)
	for _, u := range lanes {
		wg.Add(1)
		go func() { defer wg.Done(); u.loop(stop, comp) }()
	}
	tr := tracker{end: p.watermark.Load()}
	var err error
	for err == nil {
		select {
		case <-p.stopCh:
			err = errStopped
		case m := <-p.in:
			err = p.admit(m, lanes, &tr)
		case c := <-comp:
			err = p.apply(c, &tr)
		case s := <-p.skips:
			if len(tr.offs) == 0 {
				err = p.passRecordless(s)
				tr.end = max(tr.end, p.watermark.Load())
			}
		}
		for err == nil && len(comp) > 0 { // coalesce completions into one advance
			err = p.apply(<-comp, &tr)
		}
		if err == nil {
			err = p.advanceTo(tr.low())
		}
	}
	close(stop)
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	for waiting := true; waiting; {
		select {
		case c := <-comp:
			if c.err == nil {
				tr.complete(c.offsets)
			}
		case <-finished:
			waiting = false
		}
	}
	for len(comp) > 0 {
		if c := <-comp; c.err == nil {
			tr.complete(c.offsets)
		}
	}
	if errors.Is(err, errStopped) && p.workCtx.Err() == nil {
		// The units in flight finished: their offsets belong under the watermark the next
		// owner starts from (the done rows say so too; this spares it the skip).
		_ = p.advanceTo(tr.low())
	}
	var dropped int64
	for _, u := range lanes {
		for _, m := range u.q.drain() {
			dropped += messageBytes(m)
		}
	}
	p.bytes.Add(-dropped)
	p.busy.Store(0)
	p.lanes.Store(nil)
	return err
}

// admit takes message m from the poll loop: dropped when below the watermark, passed when
// already done (doneAbove), else marked in flight (ahead, as the serial worker does) and
// queued on its lane.
func (p *worker) admit(m *kafka.Message, lanes []*lane, tr *tracker) error {
	off := int64(m.TopicPartition.Offset)
	if off < p.watermark.Load() || (len(tr.offs) > 0 && off <= tr.offs[len(tr.offs)-1]) {
		p.bytes.Add(-messageBytes(m))
		p.emit.RedeliveryDropped(p.tp, 1)
		return nil
	}
	if p.doneAbove[off] {
		delete(p.doneAbove, off)
		tr.push(off, true)
		p.bytes.Add(-messageBytes(m))
		p.emit.RedeliveryDropped(p.tp, 1)
		return nil
	}
	if off >= p.inflightEnd {
		ahead := p.markAhead(off + 1)
		if err := p.waits.untilDone(off, func() error {
			return p.store.MarkInflight(p.workCtx, p.pool, p.group, p.tp, p.logID, p.watermark.Load(), ahead)
		}); err != nil {
			return err
		}
		p.inflightEnd = ahead
	}
	tr.push(off, false)
	p.busy.Add(1)
	lanes[LaneOf(m.Key, off, len(lanes))].q.push(m)
	return nil
}

// apply records a lane's report.
func (p *worker) apply(c laneDone, tr *tracker) error {
	if c.err != nil {
		return c.err
	}
	tr.complete(c.offsets)
	p.busy.Add(-int64(len(c.offsets)))
	return nil
}

// advanceTo moves the watermark to next (when it is ahead) over offsets the lanes recorded
// done, in a transaction of its own (advanceAlone): the done rows below next are deleted, the
// in-flight marker kept.
func (p *worker) advanceTo(next int64) error {
	if next <= p.watermark.Load() {
		return nil
	}
	return p.advanceAlone(advance{to: next, read: next, inflightEnd: p.inflightEnd, clearDone: true})
}

// loop is a lane's goroutine: unit after unit of its queue until stop; an error that stops it
// is reported on comp.
func (u *lane) loop(stop <-chan struct{}, comp chan<- laneDone) {
	for {
		msgs := u.q.take(u.p.set.BatchSize, stop)
		if msgs == nil {
			return
		}
		err := u.acquire(stop)
		if err == nil {
			if err = u.waits.holdBack(); err == nil {
				err = u.process(msgs)
			}
			u.release()
		}
		var held int64
		for _, m := range msgs {
			held += messageBytes(m)
		}
		u.p.bytes.Add(-held)
		if err != nil {
			comp <- laneDone{err: err}
			return
		}
	}
}

// acquire takes one of the process-wide unit slots (Settings.MaxUnits).
func (u *lane) acquire(stop <-chan struct{}) error {
	if u.p.units == nil {
		return nil
	}
	select {
	case u.p.units <- struct{}{}:
		return nil
	case <-stop:
		return errStopped
	}
}

func (u *lane) release() {
	if u.p.units != nil {
		<-u.p.units
	}
}

func containsAll(sorted, offs []int64) bool {
	for _, o := range offs {
		if i := sort.Search(len(sorted), func(i int) bool { return sorted[i] >= o }); i == len(sorted) || sorted[i] != o {
			return false
		}
	}
	return true
}
