package engine

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/internal/pgerr"
	"github.com/kafkatx/kafkatx/pg"
)

// waits holds every wait of a partition worker, in one place: the retry of database work that
// is never an attempt (untilDone, afterDBError), the wait for a dependency the handler reported
// Unavailable (waitUnavailable and its window), the hold of Config.Backpressure before a batch
// (holdBack), and the backoff between two attempts of a failing message (beforeRetry). Every
// wait ends early with errStopped when the worker is asked to stop. Owned by the worker's
// goroutine except the atomics, which Stats and Readiness read.
type waits struct {
	p    *worker
	stop <-chan struct{} // closed: end every wait with errStopped (the worker's stop, or a lane round's)

	// A wait for a dependency the handler reported Unavailable.
	unavailSince   time.Time               // zero when not waiting
	unavailN       int                     // Unavailable answers since unavailSince
	unavailExpired bool                    // Config.UnavailableMaxWait passed: answers count as attempts
	waiting        atomic.Pointer[Waiting] // set while waiting, for Stats and Readiness

	// Units ended by the server's idle_in_transaction_session_timeout (25P03) in a row at one
	// offset (idleKilled).
	idleKillAt int64
	idleKillN  int
	idleShown  *Waiting // the Waiting idleKilled stored, cleared when a unit succeeds

	// Config.Backpressure's hold.
	heldBack      atomic.Bool                         // in Config.Backpressure now, for Stats
	backpressWarn time.Time                           // its last failure logged
	backpressFail atomic.Pointer[BackpressureFailure] // set while the check fails, for Readiness
}

// Waiting is a partition waiting for a dependency its handler reported Unavailable.
type Waiting struct {
	Topic     string
	Partition int32
	Offset    int64     // the message held
	Since     time.Time // the first Unavailable answer
	Cause     string    // the last answer, sanitized
	// Condition names the database's own condition the partition waits out ("53100
	// disk_full", internal/pgerr), or is empty for a dependency's Unavailable answer.
	Condition string
}

// errWaited is returned by the loop's transactions instead of a handler's Unavailable error
// that is still within its window: the transaction rolled back and untilDone retries after
// waitUnavailable.
type errWaited struct{ cause error }

func (e *errWaited) Error() string { return e.cause.Error() }
func (e *errWaited) Unwrap() error { return e.cause }

// sleep waits d unless the worker is asked to stop (errStopped).
func (w *waits) sleep(d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-w.stop:
		return errStopped
	}
}

// untilDone runs op — a transaction body or one of the loop's own statements — until it
// succeeds, and is the loop's one retry of database work: a database error (retryable or not,
// see afterDBError) runs it again after a backoff, and an Unavailable answer of the handler
// inside it (errWaited) after waitUnavailable for offset. Neither counts as an attempt. It
// returns errStopped when the worker is asked to stop and offsetstore.ErrFenced when another
// owner moved the watermark.
func (w *waits) untilDone(offset int64, op func() error) error {
	return w.retry(offset, false, op)
}

// untilCharged is untilDone for a unit of messages starting at offset (a batch, or one
// message's try): a unit the server ends with 25P03 idle_in_transaction_session_timeout
// IdleEndsToCharge times in a row at that offset ends it with an *errIdleKilled, which the
// caller charges to the messages as a failure (idleKilled).
func (w *waits) untilCharged(offset int64, op func() error) error {
	return w.retry(offset, true, op)
}

func (w *waits) retry(offset int64, charge bool, op func() error) error {
	for try := 1; ; try++ {
		err := op()
		var waited *errWaited
		if err == nil || !pgerr.IsCode(err, "25P03") {
			w.idleCleared()
		}
		switch {
		case err == nil:
			return nil
		case pgerr.IsCode(err, "25P03"):
			if ik := w.idleKilled(offset, charge, err); ik != nil {
				return ik
			}
			if err := w.afterDBError(try, err); err != nil {
				return err
			}
		case errors.Is(err, errStopped), errors.As(err, new(*errPark)):
			return err
		case errors.As(err, &waited):
			if err := w.waitUnavailable(offset, waited.cause); err != nil {
				return err
			}
			try = 0 // a dependency that answers again starts the database backoff afresh
		case errors.As(err, new(*errHeld)):
			// The breaker holds this try (breaker.go): no attempt; probe again later.
			if err := w.sleep(w.p.breaker.probe); err != nil {
				return err
			}
			try = 0
		default:
			if err := w.afterDBError(try, err); err != nil {
				return err
			}
		}
	}
}

// IdleEndsToCharge is how many times in a row the server may end the transaction of a unit
// starting at one offset with 25P03 (idle_in_transaction_session_timeout) before it is the
// message's fault: once is a DBA's timeout meeting a slow moment (a pause of the process, a
// slow dependency) and spends no attempt; the same offset's unit ended every time it runs is
// a handler that always holds its transaction idle past the bound — a pill, like a crash
// pill — and from then on each such end is an attempt of the message (dead-lettered at
// MaxAttempts). 25P03 ending units at different offsets stays the systemic condition it is.
const IdleEndsToCharge = 3

// errIdleKilled ends untilCharged when the unit at Offset was ended by 25P03 IdleEndsToCharge
// times in a row (or again after that): the caller records it as the handler's failure.
type errIdleKilled struct {
	Offset int64
	N      int // ends in a row at Offset
	Bound  time.Duration
	Cause  error
}

func (e *errIdleKilled) Error() string {
	return fmt.Sprintf("the transaction was ended by idle_in_transaction_session_timeout (SQLSTATE 25P03, Config.Transaction.IdleTimeout %s) %d times in a row "+
		"at offset %d: the handler holds its transaction idle past the bound every time it runs (waiting on something other than the database inside it); counted as an attempt: %v",
		e.Bound, e.N, e.Offset, e.Cause)
}

func (e *errIdleKilled) Unwrap() error { return e.Cause }

// idleKilled counts a unit at offset ended by 25P03 (err), shows it to Readiness at once (a
// Waiting whose Condition names 25P03) and returns the *errIdleKilled to charge when charge
// and the count at offset reached IdleEndsToCharge; nil to run the unit again, not an attempt.
func (w *waits) idleKilled(offset int64, charge bool, err error) error {
	if w.idleKillN == 0 || w.idleKillAt != offset {
		w.idleKillAt, w.idleKillN = offset, 0
	}
	w.idleKillN++
	since := time.Now()
	if w.idleShown != nil {
		since = w.idleShown.Since
	}
	ws := &Waiting{Topic: w.p.tp.Topic, Partition: w.p.tp.Partition, Offset: offset, Since: since,
		Cause: pg.SanitizeText(err.Error(), 512), Condition: pgerr.Describe(err).String()}
	if cur := w.waiting.Load(); cur == nil || cur == w.idleShown { // never over a dependency's wait
		w.waiting.Store(ws)
		w.idleShown = ws
	}
	if !charge || w.idleKillN < IdleEndsToCharge {
		return nil
	}
	return &errIdleKilled{Offset: offset, N: w.idleKillN, Bound: w.p.set.IdleTimeout, Cause: err}
}

// idleCleared ends what idleKilled showed once a unit ends otherwise.
func (w *waits) idleCleared() {
	if w.idleShown != nil {
		w.waiting.CompareAndSwap(w.idleShown, nil)
		w.idleShown = nil
	}
}

// idleReset forgets the count, for a unit charged as a whole batch: the messages then run one
// per transaction, each counted afresh.
func (w *waits) idleReset() { w.idleKillN = 0 }

// afterDBError decides what follows an error of the loop's own database work (not the
// handler's): errStopped when the worker is stopping, the error itself when fenced, else a
// backoff after which the caller runs the statement or transaction again — never an attempt.
// Errors that are not retryable conditions (a missing table, a revoked permission) are logged
// at error level: the partition waits for an operator rather than skipping anything. n is
// the caller's try count, for the backoff.
func (w *waits) afterDBError(n int, err error) error {
	p := w.p
	if p.workCtx.Err() != nil {
		return errStopped
	}
	if errors.Is(err, offsetstore.ErrFenced) {
		return err
	}
	d := p.set.Backoff(min(n, 8))
	if RetryableDB(err) {
		fields := []zap.Field{zap.Error(err), zap.Duration("backoff", d)}
		if pgerr.IsCode(err, "25006") {
			// A read-only server (an old primary after a switchover, a standby): every
			// connection of the pool may be on it. Discard them all (in-use ones when
			// released) so the retry connects afresh.
			p.pool.Reset()
			fields = append(fields, zap.String("hint", "the server refuses writes (read-only: an old primary after a switchover, or a standby); "+
				"the pool's connections were discarded; list every host with target_session_attrs=read-write to reach the new primary"))
		}
		if pgerr.IsCode(err, "25P03") {
			fields = append(fields, zap.String("hint", fmt.Sprintf("the transaction sat idle longer than Config.Transaction.IdleTimeout (%s): "+
				"this process was frozen or cut off, or the handler waits on something other than the database inside its transaction; "+
				"a unit ended by it %d times in a row at one offset is charged to its message as an attempt", p.set.IdleTimeout, IdleEndsToCharge)),
				zap.Int("idle_timeout_ends_in_a_row", w.idleKillN))
		}
		fields = append(fields, zap.Stringer("condition", pgerr.Describe(err)))
		p.log.Warn("retryable database error; running it again (not an attempt)", fields...)
	} else {
		p.log.Error("database error in the loop's own statements; the partition waits and tries again", zap.Error(err), zap.Duration("backoff", d))
	}
	return w.sleep(d)
}

// beforeRetry waits Config.Retry's backoff before try a.Attempts+1 of a message whose try
// a.Attempts failed with a.ErrorClass, and counts the retry.
func (w *waits) beforeRetry(a offsetstore.Attempt) error {
	p := w.p
	d := p.set.Backoff(a.Attempts)
	p.log.Info("retrying after backoff", zap.Int64("offset", a.Offset), zap.Int("attempt", a.Attempts+1), zap.Duration("backoff", d))
	p.emit.RetryScheduled(p.tp, a.Offset, a.Attempts, a.ErrorClass, d)
	return w.sleep(d)
}

// stillUnavailable reports whether herr, an Unavailable answer (Sort's Wait), is one the
// partition should still wait out: false once Config.UnavailableMaxWait has passed for the
// current message, when it counts as an ordinary failure.
func (w *waits) stillUnavailable(herr error) bool {
	if w.unavailSince.IsZero() || time.Since(w.unavailSince) < w.p.set.UnavailableMaxWait {
		return true
	}
	if !w.unavailExpired {
		w.unavailExpired = true
		w.p.log.Warn("dependency still unavailable after the partition's wait window; the message's tries now count as attempts",
			zap.Duration("window", w.p.set.UnavailableMaxWait), zap.String("error", pg.SanitizeText(herr.Error(), 512)))
	}
	return false
}

// waitUnavailable waits before the next try of offset after its handler answered
// Unavailable (cause): Settings.UnavailableBackoff of the consecutive answers. It returns
// errStopped when the worker is asked to stop.
func (w *waits) waitUnavailable(offset int64, cause error) error {
	p := w.p
	if w.unavailSince.IsZero() {
		w.unavailSince = time.Now()
	}
	cond, server := ServerCondition(cause)
	wt := &Waiting{Topic: p.tp.Topic, Partition: p.tp.Partition, Offset: offset,
		Since: w.unavailSince, Cause: pg.SanitizeText(cause.Error(), 512)}
	if server {
		wt.Condition = cond.String()
	}
	w.waiting.Store(wt)
	w.unavailN++
	d := p.set.UnavailableBackoff(min(w.unavailN, 16))
	p.emit.DependencyUnavailable(p.tp, offset, w.unavailSince, d)
	if server {
		if cond.SQLState == "25006" {
			// A read-only server: every connection of the pool may be on it; discard them
			// so the next try connects afresh (docs/deployment.md).
			p.pool.Reset()
		}
		// The server's own condition (docs/failures.md): logged when it starts, then every
		// eighth try, not at every probe.
		if w.unavailN == 1 || w.unavailN%8 == 0 {
			p.log.Warn("the database's own condition; the partition waits it out and runs the message again (not an attempt)",
				zap.Int64("offset", offset), zap.String("condition", wt.Condition), zap.String("cause", wt.Cause),
				zap.Duration("waited", time.Since(w.unavailSince)), zap.Duration("backoff", d), zap.Duration("bound", p.set.UnavailableMaxWait))
		}
		return w.sleep(d)
	}
	p.log.Warn("dependency unavailable; the partition waits and runs the message again (not an attempt)",
		zap.Int64("offset", offset), zap.String("cause", pg.SanitizeText(cause.Error(), 512)),
		zap.Duration("waited", time.Since(w.unavailSince)), zap.Duration("backoff", d))
	return w.sleep(d)
}

// available ends a wait for an unavailable dependency: the message it held committed, was
// dead-lettered or failed for another reason (answered), or the worker stopped.
func (w *waits) available(answered bool) {
	if w.unavailSince.IsZero() {
		return
	}
	if answered {
		w.p.log.Info("dependency answered again; the partition goes on", zap.Duration("waited", time.Since(w.unavailSince)))
	}
	since := w.unavailSince
	w.unavailSince, w.unavailN, w.unavailExpired = time.Time{}, 0, false
	w.waiting.Store(nil)
	w.p.emit.DependencyAvailable(w.p.tp, since)
}

// availableUnless ends a wait when herr, an ordinary failure of the message, is not an
// Unavailable answer past its window (which keeps the window closed until the message ends).
func (w *waits) availableUnless(herr error) {
	if !IsUnavailable(herr) {
		w.available(true)
	}
}

// backpressureNote is how long a Config.Backpressure hold lasts before it is logged.
const backpressureNote = 10 * time.Second

// holdBack calls Config.Backpressure, if set, before a batch: it returns errStopped when the
// worker was asked to stop while it waited, else nil. A hold longer than backpressureNote is
// logged when it starts to show and when it ends. A throttle that ignores its context is left
// behind once the partition's work is aborted (the shutdown timeout, a lost partition): the
// worker returns, the throttle's goroutine goes on, and the partition's next owner (this
// member again, after a new assignment) calls it afresh.
//
// A check that fails (an error or a panic, with its stack) cannot answer whether the batch
// may run, so the batch is held as an Unavailable dependency's message is: the check is
// called again after Settings.UnavailableBackoff (capped at 10 s), logged at warn level when
// it starts failing and every eighth try, and Readiness names it (Snapshot.BackpressureFailing)
// — for at most Settings.UnavailableMaxWait since its first failure; past that the batch runs
// (and each later batch after one call) until the check answers again: bounded, never a
// stall, and never a bound that stops holding the moment its check fails.
func (w *waits) holdBack() error {
	p := w.p
	bp := p.set.Backpressure
	if bp == nil {
		return nil
	}
	for n := 1; ; n++ {
		err := w.callBackpressure(bp)
		if errors.Is(err, errStopped) {
			return err
		}
		if err == nil {
			if f := w.backpressFail.Swap(nil); f != nil {
				p.log.Info("Config.Backpressure answers again; the partition goes on", zap.Duration("failed_for", time.Since(f.Since)))
			}
			return nil
		}
		f := w.backpressFail.Load()
		if f == nil {
			f = &BackpressureFailure{TP: p.tp, Since: time.Now()}
		} else {
			f = &BackpressureFailure{TP: p.tp, Since: f.Since}
		}
		f.Error = pg.SanitizeText(err.Error(), 512)
		w.backpressFail.Store(f)
		expired := time.Since(f.Since) >= p.set.UnavailableMaxWait
		d := p.set.UnavailableBackoff(min(n, 16))
		if n == 1 || n%8 == 0 || expired && time.Since(w.backpressWarn) >= time.Minute {
			w.backpressWarn = time.Now()
			fields := []zap.Field{zap.Error(err), zap.Duration("failing_for", time.Since(f.Since)), zap.Duration("bound", p.set.UnavailableMaxWait)}
			var pe *Panic
			if errors.As(err, &pe) {
				fields = append(fields, zap.ByteString("stack", pe.Stack))
			}
			if expired {
				p.log.Warn("Config.Backpressure still fails past its bound (Config.UnavailableMaxWait); the batch runs", fields...)
			} else {
				p.log.Warn("Config.Backpressure failed; the batch waits and the check runs again (bounded by Config.UnavailableMaxWait)",
					append(fields, zap.Duration("backoff", d))...)
			}
		}
		if expired {
			return nil
		}
		if err := w.sleep(d); err != nil {
			return err
		}
	}
}

// BackpressureFailure is a partition whose Config.Backpressure check fails: since when, and
// its last error (sanitized, at most 512 bytes).
type BackpressureFailure struct {
	TP    offsetstore.TP
	Since time.Time
	Error string
}

// callBackpressure makes one call of bp for the worker: its error (a panic as *Panic), or
// errStopped when the worker was asked to stop meanwhile.
func (w *waits) callBackpressure(bp func(context.Context) error) error {
	p := w.p
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
					err = &Panic{Value: v, Stack: debug.Stack(), Of: "Config.Backpressure"}
				}
			}()
			return bp(ctx)
		}()
	}()
	w.heldBack.Store(true)
	defer w.heldBack.Store(false)
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
			select {
			case <-done:
			case <-time.After(time.Second):
				p.log.Warn("Config.Backpressure did not return after the partition's work was aborted; left behind")
			}
			return errStopped
		}
	}
	if noted {
		p.log.Info("partition no longer held back", zap.Duration("held", time.Since(start)))
	}
	if p.stopping() {
		return errStopped
	}
	return err
}

// ConditionReason is the consumer's readiness reason (kafkatx.Readiness) while partitions
// wait out the database's own condition: the condition (SQLSTATE and name) of the longest
// wait, since when, and how many partitions wait; "" when none does.
func ConditionReason(ws []Waiting) string {
	var first *Waiting
	n := 0
	for i := range ws {
		if ws[i].Condition == "" {
			continue
		}
		n++
		if first == nil || ws[i].Since.Before(first.Since) {
			first = &ws[i]
		}
	}
	if first == nil {
		return ""
	}
	if strings.HasPrefix(first.Condition, "25P03") {
		return fmt.Sprintf("the database ended the transaction of %s[%d] offset %d: %s (Config.Transaction.IdleTimeout: the handler held it idle past the bound) since %s, "+
			"on %d partition(s); it runs again, not an attempt, unless the same offset's transaction is ended %d times in a row: then each end is an attempt of that message (docs/failures.md)",
			first.Topic, first.Partition, first.Offset, first.Condition, first.Since.UTC().Format(time.RFC3339), n, IdleEndsToCharge)
	}
	return fmt.Sprintf("the database's own condition %s since %s: %d partition(s) wait it out, spending no attempt (docs/failures.md)",
		first.Condition, first.Since.UTC().Format(time.RFC3339), n)
}
