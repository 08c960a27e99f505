package engine

import (
	"context"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
)

// mode is what a lane's strategy changes in the one path of executor.go: how a unit's offsets
// are marked in flight before it runs, and how its transaction ends. serialMode is the
// worker's one lane (Concurrency 1, and every suspect range): its transactions move the
// watermark themselves. laneMode is one of Concurrency lanes (lanes.go): its transactions
// record their offsets done and the coordinator moves the watermark.
type mode interface {
	// mark makes the in-flight marker cover [first, end) before a unit runs them.
	mark(u *lane, first, end int64) error
	// finish ends tx, which completed f.msgs (the handler's or a dead letter's), and commits it.
	finish(ctx context.Context, u *lane, tx pgx.Tx, f finish) error
	// held records how many messages the lane still holds, for Stats and the idle check.
	held(u *lane, n int)
}

// finish is what a transaction that completed msgs hands its lane's mode.
type finish struct {
	msgs []*kafka.Message
	// end is the watermark after msgs (serialMode); ahead lets the in-flight marker reach
	// ahead of it (a batch: markAhead), else it stays.
	end   int64
	ahead bool
	// clearAttempts deletes msgs' attempt rows (they had some: a message run alone).
	clearAttempts bool
	// t is what the body found (nil for a dead letter, which deadLetter records); start is
	// when the transaction began.
	t     *Tried
	start time.Time
}

// serialMode is the serial lane's: the marker is the worker's, each commit moves the watermark.
type serialMode struct{}

// mark: in a suspect range exactly first's piece (isolate.go), else reaching ahead
// (markAhead) when end is past the marker; usually the previous commit wrote it.
func (serialMode) mark(u *lane, first, end int64) error {
	want := u.p.inflightEnd
	switch {
	case u.p.sus.holds(first):
		want = u.p.sus.pieceEnd(first)
	case end > u.p.inflightEnd:
		want = u.p.markAhead(end)
	}
	if want == u.p.inflightEnd {
		return nil
	}
	if err := u.waits.untilDone(first, func() error {
		return u.p.store.MarkInflight(u.p.workCtx, u.p.pool, u.p.group, u.p.tp, u.p.logID, u.p.watermark.Load(), want)
	}); err != nil {
		return err
	}
	u.p.inflightEnd = want
	return nil
}

// markAfter is the in-flight marker a transaction that moves the watermark to end leaves: in
// a suspect range the end of end's piece (the next piece's marker, written with this commit),
// else reaching ahead (markAhead) when ahead, or the one in place.
func (serialMode) markAfter(u *lane, end int64, ahead bool) int64 {
	switch {
	case u.p.sus.holds(end):
		return u.p.sus.pieceEnd(end)
	case ahead:
		return u.p.markAhead(end)
	}
	return u.p.inflightEnd
}

// finish ends the serial lane's transaction with the watermark's advance over f.msgs
// (advance: the gap audit, msgs' attempt rows deleted when they had some, the done rows the
// lane passed (passDone) deleted, the compare-and-set to f.end with the in-flight marker at
// markAfter, the commit, the Kafka committer), then records the commit.
func (m serialMode) finish(ctx context.Context, u *lane, tx pgx.Tx, f finish) error {
	from, end := int64(f.msgs[0].TopicPartition.Offset), f.end
	if err := u.p.advance(ctx, tx, advance{to: end, read: from, inflightEnd: m.markAfter(u, end, f.ahead),
		clearAttempts: f.clearAttempts, clearDone: u.p.doneRowsTo > 0, msgs: f.msgs}); err != nil {
		return err
	}
	u.waits.available(true)
	u.recordCommit(f, from, end)
	return nil
}

func (serialMode) held(u *lane, n int) { u.p.busy.Store(int64(n)) }

// recordCommit ends a spell of shared failures (the breaker) when handled messages
// committed, and reports the commit of [from, end) with what the body found.
func (u *lane) recordCommit(f finish, from, end int64) {
	if f.t != nil && f.t.Verdict == Done {
		u.p.breaker.succeeded()
	}
	if f.t != nil {
		u.p.emit.BatchCommitted(u.p.tp, from, end, *f.t, time.Since(f.start))
	}
}

// laneMode is one of Concurrency lanes' (lanes.go): the coordinator marks what it admits, a
// unit's commit records its offsets done and reports them to the coordinator on comp.
type laneMode struct {
	comp chan<- laneDone
}

func (laneMode) mark(*lane, int64, int64) error { return nil }
func (laneMode) held(*lane, int)                {}

// finish: msgs' attempt rows deleted, their offsets recorded done (fenced:
// offsetstore.ErrFenced when the watermark passed them or another owner recorded one),
// commit, then the report to the coordinator.
func (m laneMode) finish(ctx context.Context, u *lane, tx pgx.Tx, f finish) error {
	offs := make([]int64, len(f.msgs))
	for i, km := range f.msgs {
		offs[i] = int64(km.TopicPartition.Offset)
	}
	if f.clearAttempts {
		if err := u.p.store.DeleteAttemptsAt(ctx, tx, u.p.group, u.p.tp, offs); err != nil {
			return err
		}
	}
	xid, err := u.p.store.MarkDoneXID(ctx, tx, u.p.group, u.p.tp, offs)
	if err != nil {
		return err
	}
	// A lost COMMIT answer is settled from the database's record; when the server no longer
	// knows the transaction, the done rows tell.
	if err := u.p.commit(ctx, tx, xid, func() bool {
		done, rerr := u.p.store.Done(context.WithoutCancel(ctx), u.p.pool, u.p.group, u.p.tp, offs[0])
		return rerr == nil && containsAll(done, offs)
	}); err != nil {
		return err
	}
	for _, o := range offs {
		u.p.set.Signals.step("db-committed", o)
	}
	u.waits.available(true)
	u.p.lastCommit.Store(time.Now().UnixNano())
	u.recordCommit(f, offs[0], offs[len(offs)-1]+1)
	m.comp <- laneDone{offsets: offs}
	return nil
}
