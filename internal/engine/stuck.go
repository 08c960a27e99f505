package engine

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/offsetstore"
)

// A handler that never returns used to be silent — its partition stalled with no log line,
// readiness stayed ready — and kept SIGTERM from finishing while it ignored its context. So
// each worker records when its current handler call started (handlerCall), the loop checks
// about once a second (checkStuck), and a call running past Settings.StuckAfter — derived
// from Config.Transaction: statement_timeout plus idle_in_transaction_session_timeout, past
// which the call cannot be doing useful database work — is logged once at error level with
// its partition and offset, reported by the emitter (a metric) and by Snapshot (readiness).
// On shutdown or revocation a worker whose handler ignores the aborted context is abandoned
// Settings.CloseTimeout after the abort: its transaction's backend is terminated
// (pg_terminate_backend: the transaction rolls back, never committed half-done) and the
// partition released; the goroutine ends whenever the handler returns.

// handlerCall is a worker's handler call in progress: since (unix nanos, 0 when none), the
// first offset of its transaction and the backend of that transaction.
type handlerCall struct {
	since  atomic.Int64
	offset atomic.Int64
	pid    atomic.Uint32
	stuck  atomic.Bool // logged and reported as stuck
}

// Stuck is a partition whose handler call has run past Settings.StuckAfter.
type Stuck struct {
	TP     offsetstore.TP
	Offset int64
	Since  time.Time
}

// trackBegin records that a unit starting at offset is about to run (its Prepare, then its
// transaction's handler calls) and returns the begin function for it, which also records the
// transaction's backend.
func (u *lane) trackBegin(offset int64) func(context.Context) (pgx.Tx, error) {
	u.call.offset.Store(offset)
	u.call.pid.Store(0)
	u.call.since.Store(time.Now().UnixNano())
	return func(ctx context.Context) (pgx.Tx, error) {
		tx, err := u.p.begin(ctx)
		if err == nil {
			if c := tx.Conn(); c != nil && c.PgConn() != nil {
				u.call.pid.Store(c.PgConn().PID())
			}
		}
		return tx, err
	}
}

// handlerEnded records that the unit's handler returned; a call reported stuck is reported
// as ended.
func (u *lane) handlerEnded() {
	since := u.call.since.Swap(0)
	u.call.pid.Store(0)
	if u.call.stuck.Swap(false) {
		u.p.log.Warn("the handler returned after running past its bound", zap.Int64("offset", u.call.offset.Load()),
			zap.Duration("ran", time.Since(time.Unix(0, since))))
		u.p.emit.HandlerStuck(u.p.tp, u.call.offset.Load(), time.Unix(0, since), false)
	}
}

// stuckSince returns when the lane's current call started if it has run past
// Settings.StuckAfter.
func (u *lane) stuckSince() (time.Time, bool) {
	n := u.call.since.Load()
	if n == 0 || u.p.set.StuckAfter <= 0 || time.Since(time.Unix(0, n)) < u.p.set.StuckAfter {
		return time.Time{}, false
	}
	return time.Unix(0, n), true
}

// allLanes is the worker's serial lane and, with Concurrency > 1, the lanes of its round.
func (p *worker) allLanes() []*lane {
	out := []*lane{p.serial}
	if ls := p.lanes.Load(); ls != nil {
		out = append(out, *ls...)
	}
	return out
}

// checkStuck logs and reports, once per call, each handler call running past StuckAfter.
func (l *Loop) checkStuck() {
	for _, f := range l.parts {
		for _, u := range f.w.allLanes() {
			since, ok := u.stuckSince()
			if !ok || u.call.stuck.Swap(true) {
				continue
			}
			u.p.log.Error("handler running past its bound: the partition makes no progress; handlers must honour ctx (Config.Transaction bounds the transaction, not the handler's other calls)",
				zap.Int64("offset", u.call.offset.Load()), zap.Duration("running", time.Since(since)), zap.Duration("bound", u.p.set.StuckAfter))
			u.p.emit.HandlerStuck(u.p.tp, u.call.offset.Load(), since, true)
		}
	}
}

// stuckNow lists the calls that have run past StuckAfter (under l.mu).
func (l *Loop) stuckNow() []Stuck {
	var out []Stuck
	for _, f := range l.parts {
		for _, u := range f.w.allLanes() {
			if since, ok := u.stuckSince(); ok {
				out = append(out, Stuck{TP: u.p.tp, Offset: u.call.offset.Load(), Since: since})
			}
		}
	}
	return out
}

// abandon gives up on a worker whose handler ignored the aborted context for
// Settings.CloseTimeout: the backend of its transaction is terminated, so the transaction
// rolls back (a handler that returns later cannot commit it), and the caller stops waiting.
func (p *worker) abandon() {
	for _, u := range p.allLanes() {
		pid := u.call.pid.Load()
		if u.call.since.Load() == 0 {
			continue
		}
		p.log.Error("the handler ignores its context: its transaction is abandoned (its connection closed, so it rolls back) and the partition released",
			zap.Int64("offset", u.call.offset.Load()), zap.Duration("after", p.set.CloseTimeout), zap.Uint32("backend_pid", pid))
		if pid == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if _, err := p.pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, int64(pid)); err != nil {
			p.log.Warn("terminate the abandoned transaction's backend", zap.Uint32("backend_pid", pid), zap.Error(err))
		}
		cancel()
	}
}
