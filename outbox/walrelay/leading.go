package walrelay

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/outbox"
	"github.com/kafkatx/kafkatx/pg"
)

// Leading reports, on q's database, whether a WAL relay leads schema's outbox now and whether
// outbox messages may wait for one: the WAL-mode counterpart of relay.Leading (relays.Leading
// picks by the schema's mode).
//
// A WAL relay's leadership is its slot: the relay streams from the schema's replication slot
// and a second relay is refused (SQLSTATE 55006) and stands by, so leader is true while the
// slot is active (pg_replication_slots.active). Messages are not rows: knowing whether the WAL
// past the slot holds any of the schema's would mean decoding it, which takes the slot from the
// relay that is about to start. So pending is true while the slot's confirmed_flush_lsn is
// behind the server's current WAL position (pg_current_wal_lsn): WAL the slot still retains and
// nobody has confirmed. This is never false while messages wait (they lie in that WAL); it may
// be true with none among it (other databases' writes move the WAL too), and then an inactive
// slot still retains the server's WAL without bound and the relay's retention runs nowhere,
// which is as much an alert. A schema in WAL mode whose slot is missing is not led, with
// pending true (nothing can publish its messages). Errors: the settings or the slot cannot be
// read (pg_current_wal_lsn fails on a standby).
func Leading(ctx context.Context, q pg.Querier, schema string) (leader, pending bool, err error) {
	s, err := outbox.ReadSettings(ctx, q, schema)
	if err != nil {
		return false, false, err
	}
	if s.Slot == "" {
		return false, false, fmt.Errorf("walrelay: schema %s has no slot (never in WAL mode)", pg.SchemaOr(schema))
	}
	err = q.QueryRow(ctx, `SELECT active, confirmed_flush_lsn IS NULL OR confirmed_flush_lsn < pg_current_wal_lsn()
		FROM pg_replication_slots WHERE slot_name = $1`, s.Slot).Scan(&leader, &pending)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, true, nil
	}
	if err != nil {
		return false, false, fmt.Errorf("walrelay: read slot %s: %w", s.Slot, err)
	}
	return leader, pending, nil
}
