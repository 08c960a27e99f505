package walrelay

import (
	"context"
	"fmt"
)

// awaitStandbys returns once every synchronous standby has the WAL decoded so far: it
// commits a transaction of its own after every commit the stream decoded, and a COMMIT waits
// for the standbys synchronous_standby_names requires, like any other. The transaction must
// write WAL to wait (PostgreSQL skips the wait for one that wrote none, txid_current() alone):
// it emits an empty transactional logical-decoding message under the prefix
// "kafkatx.standby-wait", which the relay (and any other decoder not asking for that prefix)
// ignores. Without synchronous standbys it returns at once (one round trip).
//
// PostgreSQL before 17 sends a decoded transaction as soon as its commit is flushed on the
// primary, before a synchronous standby has it and before its own client's COMMIT returns
// (Trendyol/go-pq-cdc#167): published then, its events would be ghosts after a failover to
// that standby, which never had the transaction. So the relay calls this before each Kafka
// commit. The role's synchronous_commit must not be off or local for it to wait.
func (r *Relay) awaitStandbys(ctx context.Context) error {
	if _, err := r.pool.Exec(ctx, `SELECT pg_logical_emit_message(true, 'kafkatx.standby-wait', '')`); err != nil {
		return fmt.Errorf("walrelay: wait for the synchronous standbys: %w", err)
	}
	return nil
}
