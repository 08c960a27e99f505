package relay

import (
	"context"
	"errors"
	"fmt"

	"github.com/kafkatx/kafkatx/internal/pgerr"
	"github.com/kafkatx/kafkatx/pg"
)

// A switchover leaves the old primary up and read-only: it answers pings, reads and advisory
// locks, and refuses every write with SQLSTATE 25006 — for days in some reports. A relay
// there must not lead: it could publish rows but never mark them, so every round would
// publish the same rows again, and a relay on the new primary would take its own lock — two
// leaders. So the leader's session is checked before the lock is taken and on every round
// (transaction_read_only: on for a session of a standby, or where
// default_transaction_read_only is on); a read-only session gives the leadership up
// (closing it releases the lock) and campaigns again on a new session after a backoff. The
// pool's sessions are discarded (pgxpool.Pool.Reset) when a write is refused with 25006,
// since a retry on them would be refused for ever; new sessions reach the writable server
// when the URL lists every host with target_session_attrs=read-write.

// errReadOnly is the leadership session's answer on a server that refuses writes.
var errReadOnly = errors.New("the database refuses writes (transaction_read_only is on: an old primary after a switchover, or a standby); " +
	"not leading until a writable server answers (list every host with target_session_attrs=read-write)")

// readOnlyServer reports whether err is a write refused by a read-only server (SQLSTATE
// 25006, read_only_sql_transaction, one of the server's conditions in internal/pgerr) or
// errReadOnly.
func readOnlyServer(err error) bool {
	return errors.Is(err, errReadOnly) || pgerr.IsCode(err, "25006")
}

// requireWritable returns errReadOnly when q's session is read-only.
func requireWritable(ctx context.Context, q pg.Querier) error {
	var ro bool
	if err := q.QueryRow(ctx, `SELECT current_setting('transaction_read_only') = 'on'`).Scan(&ro); err != nil {
		return fmt.Errorf("check the leadership session: %w", err)
	}
	if ro {
		return errReadOnly
	}
	return nil
}
