package offsetstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/offsetstate"
	"github.com/kafkatx/kafkatx/pg"
)

// Event is one offset audit row.
type Event struct {
	// Shard names the shard whose database holds the row, when a command reads a sharded
	// group (kafkatx --shard); empty otherwise. Not stored: the row's database says it.
	Shard     string    `json:"shard,omitempty"`
	ID        int64     `json:"id"`
	Group     string    `json:"group"`
	Topic     string    `json:"topic"`
	Partition int32     `json:"partition"`
	Kind      string    `json:"kind"`
	From      int64     `json:"from_offset"`
	To        int64     `json:"to_offset"`
	Reason    string    `json:"reason"`
	Actor     string    `json:"actor"`
	Status    string    `json:"status"`
	At        time.Time `json:"at"`
}

// InsertEvent writes e (status defaults to "applied") and returns its id. A halt (KindHalt)
// is written once per change: when the partition's latest audit row is already a halt with
// e's range and reason (the reason names the log identities and the cause), nothing moved
// since and no row is written — a consumer restarted on the same halt (a supervisor's
// restart loop) would otherwise write one row per start — and that row's id is returned.
func (s *Store) InsertEvent(ctx context.Context, q pg.Querier, e Event) (int64, error) {
	if e.Status == "" {
		e.Status = "applied"
	}
	var id int64
	err := q.QueryRow(ctx, `WITH last AS (
			SELECT id, kind, from_offset, to_offset, reason FROM `+s.t.OffsetAudit+`
			WHERE group_id = $1 AND topic = $2 AND partition = $3 ORDER BY id DESC LIMIT 1),
		ins AS (
			INSERT INTO `+s.t.OffsetAudit+` (group_id, topic, partition, kind, from_offset, to_offset, reason, actor, status)
			SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9
			WHERE $4 <> '`+KindHalt+`' OR NOT EXISTS (
				SELECT 1 FROM last WHERE kind = $4 AND from_offset = $5 AND to_offset = $6 AND reason = $7)
			RETURNING id)
		SELECT id FROM ins UNION ALL SELECT id FROM last WHERE NOT EXISTS (SELECT 1 FROM ins)`,
		e.Group, e.Topic, e.Partition, e.Kind, e.From, e.To, e.Reason, e.Actor, e.Status).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("write offset audit %s %s[%d]: %w", e.Kind, e.Topic, e.Partition, err)
	}
	return id, nil
}

// PendingSkip returns the id of a pending operator skip of exactly [from, to) on tp, or 0.
func (s *Store) PendingSkip(ctx context.Context, q pg.Querier, group string, tp TP, from, to int64) (int64, error) {
	var id int64
	err := q.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM `+s.t.OffsetAudit+`
		WHERE group_id = $1 AND topic = $2 AND partition = $3 AND kind = $4 AND status = 'pending' AND from_offset = $5 AND to_offset = $6`,
		group, tp.Topic, tp.Partition, KindOperatorSkip, from, to).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("find pending operator skip %s: %w", tp, err)
	}
	return id, nil
}

// SetEventStatus marks an audit row applied or abandoned.
func (s *Store) SetEventStatus(ctx context.Context, q pg.Querier, id int64, status string) error {
	_, err := q.Exec(ctx, `UPDATE `+s.t.OffsetAudit+` SET status = $2 WHERE id = $1`, id, status)
	if err != nil {
		return fmt.Errorf("update offset audit %d: %w", id, err)
	}
	return nil
}

// Events returns the audit trail of group, oldest first (topic "" means all topics).
func (s *Store) Events(ctx context.Context, q pg.Querier, group, topic string) ([]Event, error) {
	rows, err := q.Query(ctx, `SELECT id, group_id, topic, partition, kind, from_offset, to_offset, reason, actor, status, at
		FROM `+s.t.OffsetAudit+` WHERE group_id = $1 AND ($2 = '' OR topic = $2) ORDER BY id`, group, topic)
	if err != nil {
		return nil, fmt.Errorf("read offset audit: %w", err)
	}
	defer rows.Close()
	var out []Event
	for rows.Next() {
		var e Event
		if err := rows.Scan(&e.ID, &e.Group, &e.Topic, &e.Partition, &e.Kind, &e.From, &e.To, &e.Reason, &e.Actor, &e.Status, &e.At); err != nil {
			return nil, fmt.Errorf("read offset audit: %w", err)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// LastSkipTo returns the start of the latest applied operator skip of tp for group that ended
// at w — its audit row's from_offset — and true; false when the latest operator_skip row of
// tp ends elsewhere or there is none. A command run again after an interrupted follow-up of a
// skip (`offsets reset --clear-airflow`) finds with it the range the first run skipped.
func (s *Store) LastSkipTo(ctx context.Context, q pg.Querier, group string, tp TP, w int64) (int64, bool, error) {
	var from, to int64
	err := q.QueryRow(ctx, `SELECT from_offset, to_offset FROM `+s.t.OffsetAudit+`
		WHERE group_id = $1 AND topic = $2 AND partition = $3 AND kind = $4 AND status = $5
		ORDER BY id DESC LIMIT 1`, group, tp.Topic, tp.Partition, KindOperatorSkip, StatusApplied).Scan(&from, &to)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("read the offset audit of %s: %w", tp, err)
	}
	return from, to == w && from < w, nil
}

// RewoundByHand reports whether the latest audit row of tp for group records a backward move
// of the watermark to exactly w that no kafkatx writer made (kind unexplained_move, written by
// the watermarks trigger of migration 004): a watermark set back by hand in this database,
// which is not a rollback of the database — a failover or a restore leaves no such row, since
// the database it comes back as never saw the newer watermark.
func (s *Store) RewoundByHand(ctx context.Context, q pg.Querier, group string, tp TP, w int64) (bool, error) {
	var by bool
	err := q.QueryRow(ctx, `SELECT coalesce((SELECT kind = 'unexplained_move' AND to_offset = $4 AND from_offset > to_offset
		FROM `+s.t.OffsetAudit+` WHERE group_id = $1 AND topic = $2 AND partition = $3 ORDER BY id DESC LIMIT 1), false)`,
		group, tp.Topic, tp.Partition, w).Scan(&by)
	if err != nil {
		return false, fmt.Errorf("read the offset audit of %s: %w", tp, err)
	}
	return by, nil
}

// MarkedHere is offsetstate.Offsets.KMarkedHere, the one rule for both the consumer's start
// decision (engine, Loop.reconcile) and offsets status: Kafka's committed offset k of tp,
// ahead of the watermark w, carries kafkatx's own commit mark (marked) of this database (db),
// and the watermark was not set back by hand (RewoundByHand) — so the database lost
// transactions the consumer had committed (a failover, a restore). It asks the database only
// when the rest holds.
func (s *Store) MarkedHere(ctx context.Context, q pg.Querier, group string, tp TP, mark offsetstate.CommitMark, marked bool,
	db offsetstate.Database, w int64, hasW bool, k int64, hasK bool) (bool, error) {
	if !hasW || !hasK || k <= w || !marked || !mark.Same(db) {
		return false, nil
	}
	by, err := s.RewoundByHand(ctx, q, group, tp, w)
	return !by, err
}
