package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/offsetstore"
)

// The watermark's advance after a batch, written once. Three paths move a partition's
// watermark over offsets it has read: a transaction of the serial lane, which ran the
// messages itself (serialMode.finish in mode.go); the lanes' coordinator, over the offsets
// its lanes recorded done (worker.advanceTo in lanes.go); and offsets the client passed
// without a record (worker.passRecordless in recordless.go). All three end in worker.advance,
// so a step added to the tail — an audit row, a delete — holds for every one. Moves that
// follow Kafka or an operator (Loop.follow at an assignment, `kafkatx offsets reset`) are not
// a batch's advance and are written apart.

// advance is a move of the watermark from where the worker has it to to, and what the
// transaction that makes it deletes with it.
type advance struct {
	to int64 // the watermark after the move; the worker's watermark now is the compare-and-set's
	// read is the first offset the transaction passes (the first message of a batch, or to):
	// a gap retention left between the watermark and read is audited (auditGap).
	read int64
	// inflightEnd is the in-flight marker the row keeps: the serial lane's markAfter, else
	// the worker's marker in place.
	inflightEnd int64
	// clearAttempts deletes the attempt rows of [read, to) (its messages had some: a message
	// run alone); clearDone the done rows below to (offsets lanes applied out of order).
	clearAttempts, clearDone bool
	// msgs are the messages the transaction ran (the serial lane's), each passing the
	// "db-committed" test step between the database commit and Kafka's.
	msgs []*kafka.Message
}

// advance is the tail of every batch's transaction that moves the watermark, in this order,
// in tx: a gap that retention (or delete-records) left in [watermark, a.read) audited as an
// unexplained skip (auditGap); the attempt and done rows a names deleted; the watermark's
// compare-and-set from the worker's watermark to a.to in the worker's log, with the in-flight
// marker a.inflightEnd (offsetstore.ErrFenced when another owner moved it); the commit, whose
// lost answer is settled from the database's record (commit: the watermark row at a.to tells
// when the server no longer knows the xid). Then, the database committed: the worker's
// watermark and marker are a.to and a.inflightEnd, the Kafka committer gets a.to (the commit
// to Kafka, asynchronous: committer.go), and readiness the commit's time. On an error the
// caller's transaction is rolled back and nothing of the tail happened in memory.
func (p *worker) advance(ctx context.Context, tx pgx.Tx, a advance) error {
	from := p.watermark.Load()
	if err := p.auditGap(ctx, tx, a.read); err != nil {
		return err
	}
	if a.clearAttempts {
		if err := p.store.DeleteAttempts(ctx, tx, p.group, p.tp, a.read, a.to); err != nil {
			return err
		}
	}
	if a.clearDone {
		if err := p.store.DeleteDone(ctx, tx, p.group, p.tp, a.to); err != nil {
			return err
		}
	}
	xid, err := p.store.AdvanceXID(ctx, tx, p.group, p.tp, p.logID, from, a.to, a.inflightEnd)
	if err != nil {
		return err
	}
	if err := p.commit(ctx, tx, xid, func() bool {
		ws, rerr := p.store.Watermarks(context.WithoutCancel(ctx), p.pool, p.group, []offsetstore.TP{p.tp})
		return rerr == nil && ws[p.tp].Next == a.to
	}); err != nil {
		return err
	}
	for _, km := range a.msgs {
		p.set.Signals.step("db-committed", int64(km.TopicPartition.Offset))
	}
	if a.clearDone && a.to >= p.doneRowsTo {
		p.doneRowsTo = 0 // every done row the serial lane passed is deleted
	}
	p.inflightEnd = a.inflightEnd
	p.watermark.Store(a.to)
	p.commits.enqueue(p.tp, a.to)
	p.lastCommit.Store(time.Now().UnixNano())
	return nil
}

// advanceAlone makes advance a in a transaction of its own (the lanes' coordinator, offsets
// without a record), run until done as the loop's own database work is (untilDone: errStopped,
// offsetstore.ErrFenced, or the loop's unexpected errors).
func (p *worker) advanceAlone(a advance) error {
	ctx := p.workCtx
	return p.waits.untilDone(p.watermark.Load(), func() error {
		tx, err := p.begin(ctx)
		if err != nil {
			return fmt.Errorf("begin: %w", err)
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		return p.advance(ctx, tx, a)
	})
}
