package airflow

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"

	"go.uber.org/zap"
)

// DefaultMaxConfBytes is Config.MaxConfBytes's default: 1,000,000 bytes of JSON, so that the
// request (conf, run id, note) stays under the 1 MiB that nginx, a common proxy in front of
// Airflow, accepts by default (client_max_body_size).
const DefaultMaxConfBytes = 1_000_000

// OpaqueConfBytes is the conf size from which a create that answers 5xx on every try, while
// Airflow answers a read of the same run (404: it does not exist), is taken for a conf too
// large for Airflow (apache/airflow#66779: its API answered an opaque 500, sometimes after
// creating the run) rather than for Airflow failing: 64 KiB, MySQL's TEXT column and a common
// proxy buffer size. Below it, the same answers are an *UnavailableError (Airflow failing).
const OpaqueConfBytes = 64 << 10

// ConfTooLargeError is a trigger whose conf Airflow does not take: larger than
// Config.MaxConfBytes (Status 0: nothing was sent), answered 413 Content Too Large
// (Status 413), or answered 5xx on every try while a read of the run said it does not exist,
// with a conf of at least OpaqueConfBytes (Status 5xx). The run was not created. It is not an
// *UnavailableError: retrying cannot help, and a kafkatx handler should return it as
// kafkatx.Permanent (examples/dagtrigger does), so the event is dead-lettered with this
// message — the size and the limit — at once.
type ConfTooLargeError struct {
	DAGID, RunID string
	Size         int    // the conf's JSON, in bytes
	Limit        int    // Config.MaxConfBytes (≤ 0: none)
	Status       int    // 0, 413 or the last 5xx
	Detail       string // the start of Airflow's answer, when it answered
}

func (e *ConfTooLargeError) Error() string {
	limit := "no limit set"
	if e.Limit > 0 {
		limit = fmt.Sprintf("limit %d bytes (Config.MaxConfBytes)", e.Limit)
	}
	switch {
	case e.Status == 0:
		return fmt.Sprintf("airflow: the conf of %s run %s is %d bytes of JSON, over the %s; not sent (pass a reference the task can resolve instead of the data)", e.DAGID, e.RunID, e.Size, limit)
	case e.Status == http.StatusRequestEntityTooLarge:
		return fmt.Sprintf("airflow: %s run %s: Airflow answered 413 Content Too Large to a conf of %d bytes (%s): %s", e.DAGID, e.RunID, e.Size, limit, e.Detail)
	}
	return fmt.Sprintf("airflow: %s run %s: Airflow answered %d to every create of a conf of %d bytes while it answered that the run does not exist: "+
		"the conf is taken for too large for Airflow (apache/airflow#66779; %s): %s", e.DAGID, e.RunID, e.Status, e.Size, limit, e.Detail)
}

// IsConfTooLarge reports whether err or an error it wraps is a *ConfTooLargeError.
func IsConfTooLarge(err error) bool {
	var e *ConfTooLargeError
	return errors.As(err, &e)
}

// settler settles a create that answered 5xx, or no answer, by reading the run by its id (GET
// /api/v2/dags/{dag_id}/dagRuns/{dag_run_id}): Airflow may have created the run before its
// answer failed. Found: the trigger succeeded (Result.Settled) and no other create is sent.
// The run id is the identity either way — a create sent again would answer 409 — so a 5xx
// never makes a second run; the read makes the outcome known at once and tells a conf
// Airflow cannot take from Airflow failing.
type settler struct {
	c       *Client
	run     *url.URL
	settled bool
	absent  bool // the last read answered 404: Airflow answers, the run does not exist
}

// settles reports whether err, a create's failure that may have reached Airflow (a 5xx, a
// timeout, a connection lost after the request went out: mayHaveArrived), is followed by a
// read that finds the run: it was created, and no create is sent again. A read that finds
// nothing (404) or fails lets the create be sent again; the run id keeps that safe (409).
func (s *settler) settles(ctx context.Context, cerr error) bool {
	if !mayHaveArrived(cerr) || ctx.Err() != nil {
		return false
	}
	status, err := s.read(ctx)
	var se *StatusError
	s.absent = err == nil && status == http.StatusNotFound && errors.As(cerr, &se)
	if err == nil && status == http.StatusOK {
		s.settled = true
		s.c.log.Info("trigger DAG run: the create answered an error or no answer but the run exists; settled by its run id",
			zap.String("run", s.run.Path), zap.String("create_error", cerr.Error()))
		return true
	}
	return false
}

// tooLarge returns the *ConfTooLargeError err stands for, or nil: a 413, or a 5xx while the
// run was read as absent with a conf of at least OpaqueConfBytes.
func (s *settler) tooLarge(err error, dag, run string, size int) *ConfTooLargeError {
	var se *StatusError
	if !errors.As(err, &se) {
		return nil
	}
	if se.StatusCode == http.StatusRequestEntityTooLarge || (se.StatusCode >= 500 && s.absent && size >= OpaqueConfBytes) {
		return &ConfTooLargeError{DAGID: dag, RunID: run, Size: size, Limit: s.c.cfg.MaxConfBytes, Status: se.StatusCode, Detail: se.Detail}
	}
	return nil
}

// read GETs the run once and returns the status (200: it exists; 404: it does not).
func (s *settler) read(ctx context.Context) (int, error) {
	token, err := s.c.bearer(ctx, false)
	if err != nil {
		return 0, err
	}
	status, _, _, err := s.c.roundTrip(ctx, http.MethodGet, s.run.String(), nil, token, 0, true)
	return status, err
}

// mayHaveArrived reports whether err, a create's failure, may have left the request with
// Airflow: a 5xx, or a network error other than a failed connect (a timeout, a connection
// reset or closed after the request went out).
func mayHaveArrived(err error) bool {
	var se *StatusError
	if errors.As(err, &se) {
		return se.StatusCode >= 500
	}
	var ue *url.Error
	if !errors.As(err, &ue) {
		return false
	}
	var oe *net.OpError
	return !errors.As(err, &oe) || oe.Op != "dial"
}
