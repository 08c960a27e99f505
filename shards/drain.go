package shards

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/tables"
)

// DrainError is Move's refusal at the cut-over: the old shard's relay did not publish, within
// MoveOptions.DrainWithin, the outbox rows committed there before the cut-over. The move is
// left "moving" with the old shard authoritative (its consumers run on); run it again to resume
// once the shard's relay runs.
type DrainError struct {
	Shard   string        // the shard the partition leaves
	Mode    string        // the shard's outbox mode: "table" or "wal"
	Waiting int64         // table mode: the rows still pending or packed
	Within  time.Duration // the wait's bound
}

func (e *DrainError) Error() string {
	what := fmt.Sprintf("%d outbox rows committed before the cut-over are still unpublished", e.Waiting)
	if e.Mode == "wal" {
		what = "the outbox slot has not confirmed the WAL written before the cut-over"
	}
	return fmt.Sprintf("shard %s: %s after %s: the cut-over waits for its relay to publish them, so that a key's events keep their order on the topic across the move; "+
		"is a relay running on shard %s (kafkatx_shard_relay_unowned, kafkatx outbox status)? The move stays resumable: run it again, with a longer --drain-within if the relay is behind",
		e.Shard, what, e.Within, e.Shard)
}

// drainPoll is how often drainOutbox looks again.
const drainPoll = 50 * time.Millisecond

// drainOutbox waits, for at most within (DefaultDrainWithin when 0 or less), until the relay
// of the shard reached through pool has published what its outbox held when it was called:
// in table mode every row then pending or packed (id at or below the highest such row), in
// WAL mode the WAL up to the position then (the outbox slot's confirmed_flush_lsn). Rows the
// relay parked are not waited for.
func drainOutbox(ctx context.Context, pool *pgxpool.Pool, t tables.Names, shard string, within time.Duration) error {
	if within <= 0 {
		within = DefaultDrainWithin
	}
	mode, slot := "table", ""
	err := pool.QueryRow(ctx, `SELECT mode, coalesce(slot_name, '') FROM `+t.OutboxSettings).Scan(&mode, &slot)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("read the outbox mode of shard %s: %w", shard, err)
	}
	var check string
	var arg any
	switch mode {
	case "wal":
		var lsn string
		if err := pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
			return fmt.Errorf("read the WAL position of shard %s: %w", shard, err)
		}
		check = `SELECT 0::bigint WHERE EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $2 AND confirmed_flush_lsn >= $1::pg_lsn)
			UNION ALL SELECT 1 WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $2 AND confirmed_flush_lsn >= $1::pg_lsn)`
		arg = lsn
	default:
		var top int64
		if err := pool.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM `+t.Outbox+` WHERE state IN ('pending', 'packed')`).Scan(&top); err != nil {
			return fmt.Errorf("read the outbox of shard %s: %w", shard, err)
		}
		if top == 0 {
			return nil
		}
		check = `SELECT count(*) FROM ` + t.Outbox + ` WHERE state IN ('pending', 'packed') AND id <= $1 AND $2 = $2`
		arg = top
	}
	deadline := time.Now().Add(within)
	for {
		var waiting int64
		if err := pool.QueryRow(ctx, check, arg, slot).Scan(&waiting); err != nil {
			return fmt.Errorf("read the outbox of shard %s: %w", shard, err)
		}
		if waiting == 0 {
			return nil
		}
		if !time.Now().Before(deadline) {
			return &DrainError{Shard: shard, Mode: mode, Waiting: waiting, Within: within}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(drainPoll):
		}
	}
}
