package pg

import (
	"errors"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// SessionTimedOut reports whether err is PostgreSQL's cancel of a statement by the session's
// statement_timeout (SQLSTATE 57014 "canceling statement due to statement timeout"), as
// opposed to a cancel request (57014 "… due to user request", which a cancelled context
// sends).
func SessionTimedOut(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "57014" && strings.Contains(pe.Message, "statement timeout")
}

// TimeoutRecycler recycles a pool's connections after one of its statements was cancelled by
// the session's statement_timeout. A session keeps the statement_timeout it was opened with
// (ALTER DATABASE/ROLE … SET applies to new sessions only), so a connection opened while a
// very short default was set — an operator's mistake, a migration tool's setting — times out
// kafkatx's own statements for its whole life (pgxpool: up to MaxConnLifetime, an hour by
// default) after the default is set back: the relay and the Backpressure check stayed failing
// until the process restarted. Recycle (pgxpool.Pool.Reset: idle connections closed, the ones
// in use closed when released) lets the next connections take the default in force then. At
// most once per RecycleEvery. The zero value is ready to use.
type TimeoutRecycler struct {
	last atomic.Int64 // unix nanoseconds of the last recycle
}

// RecycleEvery is the least time between two recycles of one TimeoutRecycler: 5 s.
const RecycleEvery = 5 * time.Second

// After recycles q's connections when q is a *pgxpool.Pool and err is SessionTimedOut, at most
// once per RecycleEvery; it reports whether it did. Other queriers (a connection, a
// transaction) are left as they are.
func (r *TimeoutRecycler) After(q Querier, err error) bool {
	p, ok := q.(*pgxpool.Pool)
	if !ok || p == nil || !SessionTimedOut(err) {
		return false
	}
	now := time.Now().UnixNano()
	last := r.last.Load()
	if last != 0 && time.Duration(now-last) < RecycleEvery {
		return false
	}
	if !r.last.CompareAndSwap(last, now) {
		return false
	}
	p.Reset()
	return true
}
