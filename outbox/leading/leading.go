// Package leading answers, for one database and schema, whether an outbox relay leads there
// now and whether something waits to be published: the check the consumer runs on every shard
// (kafkatx_shard_relay_unowned). It is plain SQL on the catalogs, so a consumer that only
// watches relays does not link either relay's streaming code.
package leading

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/outbox"
	"github.com/kafkatx/kafkatx/outbox/relay"
	"github.com/kafkatx/kafkatx/pg"
)

// Of reports whether a relay leads schema's outbox on q's database now and whether something
// waits to be published there, in the schema's stored mode (outbox.ReadSettings): relay.Leading
// in table mode (the leadership lock; rows pending or packed), WAL in WAL mode (the slot
// active; its confirmed position behind the current WAL). Errors: the settings, the lock or the
// slot cannot be read.
func Of(ctx context.Context, q pg.Querier, schema string) (leader, pending bool, err error) {
	s, err := outbox.ReadSettings(ctx, q, schema)
	if err != nil {
		return false, false, err
	}
	if s.Mode == outbox.ModeWAL {
		return WAL(ctx, q, schema)
	}
	return relay.Leading(ctx, q, schema)
}

// WAL reports, on q's database, whether a WAL relay leads schema's outbox now and whether
// outbox messages may wait for one: the WAL-mode counterpart of relay.Leading (Of
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
func WAL(ctx context.Context, q pg.Querier, schema string) (leader, pending bool, err error) {
	s, err := outbox.ReadSettings(ctx, q, schema)
	if err != nil {
		return false, false, err
	}
	if s.Slot == "" {
		return false, false, fmt.Errorf("outbox: schema %s has no slot (never in WAL mode)", pg.SchemaOr(schema))
	}
	err = q.QueryRow(ctx, `SELECT active, confirmed_flush_lsn IS NULL OR confirmed_flush_lsn < pg_current_wal_lsn()
		FROM pg_replication_slots WHERE slot_name = $1`, s.Slot).Scan(&leader, &pending)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, true, nil
	}
	if err != nil {
		return false, false, fmt.Errorf("outbox: read slot %s: %w", s.Slot, err)
	}
	return leader, pending, nil
}
