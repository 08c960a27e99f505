package kafkatx

import (
	"errors"
	"fmt"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/dlq"
	"github.com/kafkatx/kafkatx/internal/handlercall"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/pg"
)

// Attempts, retries and dead letters of a partition worker: a message run alone with a
// durable attempt count, its backoff, its dead letter, and the loop's one retry of database
// work (untilDone).

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
	for {
		if handlercall.GiveUp(a.ErrorClass, a.Attempts, p.c.cfg.Retry.MaxAttempts) {
			return p.deadLetter(km, a)
		}
		if a.Attempts > 0 && a.ErrorClass != "" {
			d := p.c.cfg.Retry.Backoff(a.Attempts)
			p.log.Info("retrying after backoff", zap.Int64("offset", off), zap.Int("attempt", a.Attempts+1), zap.Duration("backoff", d))
			p.c.retryScheduled(p, off, a.Attempts, a.ErrorClass, d)
			if err := p.waitRetry(d); err != nil {
				return err
			}
		}
		n := a.Attempts + 1
		// Durable before the handler runs: a crash during this try counts (invariant 3).
		if err := p.untilDone(off, func() error { return p.c.store.BeginAttempt(ctx, p.c.pool, p.c.group, p.tp, off, n) }); err != nil {
			return err
		}
		a.Attempts = n
		a.ErrorClass = "" // unknown until this try ends; a crash leaves it empty
		p.attempts[off] = a
		var herr error
		if err := p.untilDone(off, func() (err error) {
			herr, err = p.oneTx(ctx, km, n) // the same try each time: database trouble is not an attempt
			return err
		}); err != nil {
			return err
		}
		if herr == nil {
			delete(p.attempts, off)
			return nil
		}
		p.availableUnless(herr)
		if err := p.recordFailure(a, herr, "handler failed"); err != nil {
			return err
		}
		a = p.attempts[off]
	}
}

// recordFailure logs herr (at info, with what) and stores it as the failure of attempt a,
// durably in the attempts table and in p.attempts, so that the message's next try — after a
// crash too — knows its count, class and first failure time.
func (p *partition) recordFailure(a offsetstore.Attempt, herr error, what string) error {
	class, msg, stack := describe(herr)
	p.log.Info(what, zap.Int64("offset", a.Offset), zap.Int("attempt", a.Attempts),
		zap.String("error_class", class), zap.String("error", pg.SanitizeText(msg, 512)))
	if err := p.untilDone(a.Offset, func() error {
		return p.c.store.RecordFailure(p.workCtx, p.c.pool, p.c.group, p.tp, a.Offset, a.Attempts, class, msg, stack)
	}); err != nil {
		return err
	}
	now := time.Now()
	if a.FirstFailureAt.IsZero() {
		a.FirstFailureAt = now
	}
	a.LastFailureAt, a.ErrorClass, a.ErrorMessage, a.Stack = now, class, msg, stack
	p.attempts[a.Offset] = a
	return nil
}

// deadLetter dead-letters km after attempt a (deadLetterTx, retried until it commits) and
// records it.
func (p *partition) deadLetter(km *kafka.Message, a offsetstore.Attempt) error {
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
	if err := p.untilDone(off, func() error { return p.deadLetterTx(p.workCtx, d, km) }); err != nil {
		return err
	}
	delete(p.attempts, off)
	p.c.deadLettered(p, off, d.Attempts, d.ErrorClass)
	p.log.Warn("message dead-lettered", zap.Int64("offset", off), zap.Int("attempt", d.Attempts),
		zap.String("error_class", d.ErrorClass), zap.String("error", pg.SanitizeText(d.ErrorMessage, 512)))
	return nil
}

// describe splits a handler failure into its class, message and (for panics) stack.
func describe(err error) (class, msg, stack string) { return handlercall.Describe(err, permanentCause) }

// untilDone runs op — a transaction body or one of the loop's own statements — until it
// succeeds, and is the loop's one retry of database work: a database error (retryable or not,
// see afterDBError) runs it again after a backoff, and an Unavailable answer of the handler
// inside it (errWaited) after waitUnavailable for offset. Neither counts as an attempt. It
// returns errStopped when the worker is asked to stop and offsetstore.ErrFenced when another
// owner moved the watermark.
func (p *partition) untilDone(offset int64, op func() error) error {
	for try := 1; ; try++ {
		err := op()
		var waited *errWaited
		switch {
		case err == nil:
			return nil
		case errors.As(err, &waited):
			if err := p.waitUnavailable(offset, waited.cause); err != nil {
				return err
			}
			try = 0 // a dependency that answers again starts the database backoff afresh
		default:
			if err := p.afterDBError(try, err); err != nil {
				return err
			}
		}
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
		if readOnlyServer(err) {
			// Every connection of the pool may be on the read-only server: discard them all
			// (in-use ones when released) so the retry connects afresh.
			p.c.pool.Reset()
			fields = append(fields, zap.String("hint", "the server refuses writes (read-only: an old primary after a switchover, or a standby); "+
				"the pool's connections were discarded; list every host with target_session_attrs=read-write to reach the new primary"))
		}
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
