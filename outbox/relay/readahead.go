package relay

import (
	"context"
	"slices"
)

// readAhead reads the next round's rows while the current round's are produced and their
// delivery reports awaited. Without it a round was read, then produced, one after the other:
// with the relay and a consumer sharing two cores, a 1,000-row round spent about a third of
// its time reading and two thirds producing, and the outbox grew while the consumer drained.
// Used by Run's goroutine only.
//
// A read ahead starts only after a full round, from that round's last row, exactly where
// the marker will read next if every row of the round is delivered (marker.advance). The
// next round takes it only when it reads from that same row and skips the same missing
// topics; otherwise (a row failed or was parked, a mark failed, a topic appeared or went
// missing) the rows read ahead are dropped and the round reads afresh. So a round's rows are
// always "the pending rows after the previous round's last row" that the round would have
// read itself, only read a few milliseconds earlier: a transaction committed in between is
// read by a later round, as a transaction committed just after a read always is.
type readAhead struct {
	r       *Relay
	pending chan fetched // the read in flight or done, nil when none

	afterSeq, afterID int64
	skip              []string
}

type fetched struct {
	rows []row
	err  error
}

// start reads, in the background, the pending rows after (afterSeq, afterID), skipping the
// topics in skip (sorted). A read ahead not taken is dropped.
func (a *readAhead) start(ctx context.Context, skip []string, afterSeq, afterID int64) {
	a.drop()
	ch := make(chan fetched, 1)
	a.pending, a.afterSeq, a.afterID, a.skip = ch, afterSeq, afterID, skip
	go func() {
		rows, err := a.r.fetch(ctx, skip, afterSeq, afterID)
		ch <- fetched{rows: rows, err: err}
	}()
}

// take returns the rows read ahead when they were read after (afterSeq, afterID) skipping
// skip; ok is false when there is no such read (none, another position, other skipped
// topics, or it failed: the round then reads itself). It waits for a read in flight.
func (a *readAhead) take(skip []string, afterSeq, afterID int64) (rows []row, ok bool) {
	if a.pending == nil {
		return nil, false
	}
	f := <-a.pending
	a.pending = nil
	if f.err != nil || afterSeq == 0 || afterSeq != a.afterSeq || afterID != a.afterID || !slices.Equal(skip, a.skip) {
		return nil, false
	}
	return f.rows, true
}

// drop waits for a read in flight, if any, and forgets it. The leader calls it when it stops.
func (a *readAhead) drop() {
	if a.pending != nil {
		<-a.pending
		a.pending = nil
	}
}
