package kafkatx

import (
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/pg"
)

// UnavailableError is a handler error saying that a dependency outside the message is
// unavailable — an API that refuses the service's credentials, a downstream resource that does
// not exist yet, a server that is down — so the failure is not a property of the message and
// must not count against it. Create one with Unavailable and detect one with errors.As.
//
// Like River's JobSnooze, it is a control error: returned by a handler (directly, wrapped, or
// inside FailMessage), it tells the loop what to do rather than what went wrong. Any error with
// a method Unavailable() bool that returns true is treated alike (IsUnavailable). The loop then
//
//   - rolls the message's transaction back (nothing of the try is kept, no attempt is
//     recorded, no dead letter written);
//   - waits outside any transaction, pausing only the message's partition, with exponential
//     backoff from Config.Retry.InitialBackoff capped at 10 s (UnavailableMaxBackoff);
//   - runs the same message again, and again, until it succeeds or fails otherwise;
//   - once the partition has waited Config.UnavailableMaxWait for one message, treats the
//     next Unavailable answer as an ordinary failure (an attempt, retried per Config.Retry and
//     dead-lettered after MaxAttempts).
//
// Each wait is logged at warn level with its cause, counted in the
// kafkatx_dependency_unavailable_total metric, and shows in Stats.Waiting and the
// kafkatx_partition_waiting gauge while it lasts; the messages held count in Stats.InFlight,
// so a consumer with a waiting partition is never idle. A crash during the wait costs what a
// crash during a database retry costs: the in-progress try counts once.
type UnavailableError struct {
	Err error
}

func (e *UnavailableError) Error() string { return "dependency unavailable: " + e.Err.Error() }
func (e *UnavailableError) Unwrap() error { return e.Err }

// Unavailable wraps err, the reason a dependency outside the message cannot serve it now, so
// that the consumer waits and retries the message without counting an attempt (see
// UnavailableError). Unavailable(nil) returns nil.
func Unavailable(err error) error {
	if err == nil {
		return nil
	}
	return &UnavailableError{Err: err}
}

// IsUnavailable reports whether err or an error it wraps is an *UnavailableError, or has a
// method Unavailable() bool that returns true — so a client package can mark its failures
// without importing kafkatx (idempotency/airflow does; like net.Error's Timeout). The loop uses
// it to recognise a handler's Unavailable answer.
func IsUnavailable(err error) bool {
	var ue *UnavailableError
	if errors.As(err, &ue) {
		return true
	}
	var m interface{ Unavailable() bool }
	for e := err; e != nil; {
		if errors.As(e, &m) {
			if m.Unavailable() {
				return true
			}
			u, ok := m.(interface{ Unwrap() error })
			if !ok {
				return false
			}
			e = u.Unwrap()
			continue
		}
		return false
	}
	return false
}

// Unavailable reports true: an *UnavailableError is one by construction.
func (e *UnavailableError) Unavailable() bool { return true }

// UnavailableMaxBackoff caps the wait between two tries of a message whose handler returned
// Unavailable.
const UnavailableMaxBackoff = 10 * time.Second

// DefaultUnavailableMaxWait is Config.UnavailableMaxWait's default.
const DefaultUnavailableMaxWait = 30 * time.Minute

// errWaited is returned by the loop's transactions instead of a handler's Unavailable error
// that is still within its window: the transaction rolled back and the caller retries after
// waitUnavailable.
type errWaited struct{ cause error }

func (e *errWaited) Error() string { return e.cause.Error() }
func (e *errWaited) Unwrap() error { return e.cause }

// unavailable reports whether herr, a handler's error, is an Unavailable answer that the
// partition should still wait out (false once Config.UnavailableMaxWait has passed for the
// current message: then it counts as an ordinary failure).
func (p *partition) unavailable(herr error) bool {
	if !IsUnavailable(herr) {
		return false
	}
	if p.unavailSince.IsZero() {
		return true
	}
	if time.Since(p.unavailSince) < p.c.cfg.UnavailableMaxWait {
		return true
	}
	if !p.unavailExpired {
		p.unavailExpired = true
		p.log.Warn("dependency still unavailable after the partition's wait window; the message's tries now count as attempts",
			zap.Duration("window", p.c.cfg.UnavailableMaxWait), zap.String("error", pg.SanitizeText(herr.Error(), 512)))
	}
	return false
}

// waitUnavailable waits before the next try of offset after its handler answered
// Unavailable (cause): a backoff growing per consecutive answer, capped at
// UnavailableMaxBackoff. It returns errStopped when the worker is asked to stop.
func (p *partition) waitUnavailable(offset int64, cause error) error {
	if p.unavailSince.IsZero() {
		p.unavailSince = time.Now()
	}
	p.waiting.Store(&WaitingPartition{Topic: p.tp.Topic, Partition: p.tp.Partition, Offset: offset,
		Since: p.unavailSince, Cause: pg.SanitizeText(cause.Error(), 512)})
	p.unavailN++
	pol := p.c.cfg.Retry
	pol.MaxBackoff = UnavailableMaxBackoff
	d := pol.Backoff(min(p.unavailN, 16))
	p.c.dependencyUnavailable(p, offset, p.unavailSince, d)
	p.log.Warn("dependency unavailable; the partition waits and runs the message again (not an attempt)",
		zap.Int64("offset", offset), zap.String("cause", pg.SanitizeText(cause.Error(), 512)),
		zap.Duration("waited", time.Since(p.unavailSince)), zap.Duration("backoff", d))
	return p.waitRetry(d)
}

// available ends a wait for an unavailable dependency: the message it held committed, was
// dead-lettered or failed for another reason (answered), or the worker stopped.
func (p *partition) available(answered bool) {
	if p.unavailSince.IsZero() {
		return
	}
	if answered {
		p.log.Info("dependency answered again; the partition goes on", zap.Duration("waited", time.Since(p.unavailSince)))
	}
	since := p.unavailSince
	p.unavailSince, p.unavailN, p.unavailExpired = time.Time{}, 0, false
	p.waiting.Store(nil)
	p.c.dependencyAvailable(p, since)
}

// availableUnless ends a wait when herr, an ordinary failure of the message, is not an
// Unavailable answer past its window (which keeps the window closed until the message ends).
func (p *partition) availableUnless(herr error) {
	if !IsUnavailable(herr) {
		p.available(true)
	}
}
