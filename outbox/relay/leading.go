package relay

import (
	"context"
	"fmt"

	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/pg"
)

// LeadershipLockKey is the text whose hashtextextended(key, 0) is the session-level advisory
// lock the leader of schema's outbox holds ("kafkatx.relay." + schema; schema "" is
// "kafkatx"): one relay per database and schema publishes and runs retention.
func LeadershipLockKey(schema string) string { return "kafkatx.relay." + pg.SchemaOr(schema) }

// Leading reports, in one query on q's database, whether a relay leads schema's outbox now (a
// session holds the leadership lock, LeadershipLockKey, in pg_locks, which any role may read)
// and whether outbox rows wait to be published (state pending or packed; parked rows do not
// count, they wait for an operator). A relay's retention (Config.Janitor) runs on its leader
// only, so no leader means neither publishing nor retention runs on that database. The
// outbox table must exist (migrations applied): an error otherwise.
func Leading(ctx context.Context, q pg.Querier, schema string) (leader, pending bool, err error) {
	err = q.QueryRow(ctx, `SELECT
		EXISTS (SELECT 1 FROM pg_locks l
			WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
			  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
			  AND ((l.classid::bigint << 32) | l.objid::bigint) = hashtextextended($1, 0)),
		EXISTS (SELECT 1 FROM `+tables.For(pg.SchemaOr(schema)).Outbox+` o WHERE o.state IN ('pending', 'packed'))`,
		LeadershipLockKey(schema)).Scan(&leader, &pending)
	if err != nil {
		return false, false, fmt.Errorf("relay leadership: %w", err)
	}
	return leader, pending, nil
}
