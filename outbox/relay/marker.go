package relay

import (
	"context"
	"time"
)

// marker writes each round's outcomes (Relay.mark) in the background, one mark at a time, so
// that the next round reads and produces while the database deletes the previous round's
// rows: with the relay and a consumer sharing two cores, read, produce and mark took about a
// third of a round each. Used by Run's goroutine only.
//
// Two rules keep what a round reads correct while a mark is in flight:
//   - A round reads from the head of the outbox only once the previous mark is done; while
//     full rounds of delivered rows follow each other, it reads after the last row of the
//     previous round instead (after). That is safe for per-key order: a transaction numbered
//     below that row and visible only now holds none of the keys the previous rounds saw
//     (the commit trigger numbers two writers of one key in the order they become visible),
//     and it is read by the next round that starts from the head.
//   - Rows of a mark that failed (the database down through its retries) were published:
//     they are carried into the next mark and left out of every read meanwhile, so this
//     leader does not publish them twice. A leader that stops with rows still carried leaves
//     them pending; the next one publishes them again, with the same kafkatx-outbox-id.
type marker struct {
	r       *Relay
	running chan markDone // the mark in flight, nil when none

	carryRows    []row
	carryResults []result
	carried      map[int64]bool

	// afterSeq, afterID: the last row of the previous round when every row of it was
	// delivered and it was full; 0, 0: read from the head.
	afterSeq, afterID int64
}

type markDone struct {
	rows    []row
	results []result
	err     error
}

// wait waits for the mark in flight, if any. When it failed, its rows are carried into the
// next mark and its error returned.
func (m *marker) wait() error {
	if m.running == nil {
		return nil
	}
	// The leader touches its session while it waits: a mark may wait for row locks a frozen
	// former leader's mark still holds (until its idle_in_transaction_session_timeout ends
	// it), and a leader silent that long would be deposed by its own LeaderTimeout.
	tick := time.NewTicker(m.r.keepaliveEvery())
	defer tick.Stop()
	var d markDone
	for waiting := true; waiting; {
		select {
		case d = <-m.running:
			waiting = false
		case <-tick.C:
			_ = m.r.keepalive(context.Background()) // a deposition shows at the next fence
		}
	}
	m.running = nil
	if d.err == nil {
		m.carryRows, m.carryResults, m.carried = nil, nil, nil
		return nil
	}
	m.carryRows, m.carryResults = d.rows, d.results
	m.carried = make(map[int64]bool, len(d.rows))
	for _, w := range d.rows {
		m.carried[w.id] = true
	}
	m.fromHead()
	return d.err
}

// fromHead makes the next round read from the head of the outbox.
func (m *marker) fromHead() { m.afterSeq, m.afterID = 0, 0 }

// start marks rows (and the rows carried from a failed mark) in the background. The
// previous mark must be done (wait).
func (m *marker) start(ctx context.Context, rows []row, results []result) {
	if len(m.carryRows) > 0 {
		rows = append(append([]row(nil), m.carryRows...), rows...)
		results = append(append([]result(nil), m.carryResults...), results...)
	}
	done := make(chan markDone, 1)
	m.running = done
	// Delivered rows must be marked even while shutting down (mark bounds itself by
	// Config.ShutdownTimeout).
	mctx := context.WithoutCancel(ctx)
	go func() {
		if h := m.r.testHookMark; h != nil {
			h()
		}
		done <- markDone{rows: rows, results: results, err: m.r.mark(mctx, rows, results)}
	}()
}

// dropCarried returns rows without those carried from a failed mark (already published).
func (m *marker) dropCarried(rows []row) []row {
	if len(m.carried) == 0 {
		return rows
	}
	out := rows[:0]
	for _, w := range rows {
		if !m.carried[w.id] {
			out = append(out, w)
		}
	}
	return out
}

// advance sets where the next round reads: after the last row when the round was full and
// every row of it was delivered, else from the head.
func (m *marker) advance(rows []row, results []result, full bool) {
	m.fromHead()
	if !full || len(rows) == 0 {
		return
	}
	for _, res := range results {
		if res.outcome != outcomeDelivered {
			return
		}
	}
	last := rows[len(rows)-1]
	m.afterSeq, m.afterID = last.commitSeq, last.pos()
}

// finish waits for the mark in flight at the end of a leadership, at most the shutdown
// timeout beyond the one mark bounds itself by.
func (m *marker) finish(timeout time.Duration) {
	if m.running == nil {
		return
	}
	t := time.NewTimer(2 * timeout)
	defer t.Stop()
	select {
	case d := <-m.running:
		m.running = nil
		if d.err != nil {
			m.r.log.Warn("relay: the last mark failed; its published rows stay pending and will be published again by the next leader")
		}
	case <-t.C:
	}
	m.carryRows, m.carryResults, m.carried = nil, nil, nil
	m.fromHead()
}
