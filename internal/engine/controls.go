package engine

import "errors"

// kafkatx's control errors — kafkatx.Unavailable and kafkatx.Permanent — are recognised by a
// method, as net.Error's Timeout is, so that the engine (and a client package such as
// idempotency/airflow) need not import package kafkatx.

// WaitsUnbounded reports whether err, an Unavailable answer, names a target that does not exist
// yet rather than a dependency that is down: an error in its chain has a method
// WaitUnbounded() bool that returns true (idempotency/airflow's *UnavailableError for a DAG or
// an asset Airflow does not know: a DAG is often parsed after its first event). Such an answer
// is waited out without Settings.UnavailableMaxWait's bound — its tries never become attempts,
// so its message is never dead-lettered for it — and the wait is reported as any other.
func WaitsUnbounded(err error) bool {
	return chainSays(err, func(m interface{ WaitUnbounded() bool }) bool { return m.WaitUnbounded() })
}

// IsUnavailable reports whether err or an error it wraps has a method Unavailable() bool that
// returns true (*kafkatx.UnavailableError has one). An error whose Unavailable method returns
// false ends the search only when it wraps nothing.
func IsUnavailable(err error) bool {
	return chainSays(err, func(m interface{ Unavailable() bool }) bool { return m.Unavailable() })
}

// chainSays walks err's chain for the errors that implement M (errors.As) and reports whether
// one of them says true; one that says false ends the search unless it wraps another (its
// Unwrap() error), from which the search goes on. M is an interface type.
func chainSays[M any](err error, says func(M) bool) bool {
	var m M
	for e := err; e != nil; {
		if !errors.As(e, &m) {
			return false
		}
		if says(m) {
			return true
		}
		u, ok := any(m).(interface{ Unwrap() error })
		if !ok {
			return false
		}
		e = u.Unwrap()
	}
	return false
}

// PermanentCause returns the error inside the first error of err's chain with a method
// Permanent() bool that returns true (*kafkatx.PermanentError has one; its Unwrap gives the
// cause), or nil when there is none.
func PermanentCause(err error) error {
	var m interface {
		Permanent() bool
		Unwrap() error
	}
	if errors.As(err, &m) && m.Permanent() {
		if cause := m.Unwrap(); cause != nil {
			return cause
		}
		return err
	}
	return nil
}

// permanent marks an error of the loop's own rules as permanent (an idempotency key function's
// error): the message is dead-lettered at once, with the class ClassPermanent.
type permanent struct{ err error }

func (e *permanent) Error() string   { return "permanent: " + e.err.Error() }
func (e *permanent) Unwrap() error   { return e.err }
func (e *permanent) Permanent() bool { return true }
