package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/pg"
)

// ErrNotParked is returned by Release and Discard for a row that does not exist or is not
// parked.
var ErrNotParked = errors.New("outbox: no such parked row")

// ParkedRow is an outbox row the relay parked because the broker refused it for good.
type ParkedRow struct {
	ID        int64
	OutboxID  string
	Topic     string
	Key       []byte // nil for a nil key
	Value     []byte
	Partition *int32
	Attempts  int
	LastError string
	CreatedAt time.Time
	ParkedAt  time.Time
	// Waiting counts the pending rows of the same (topic, key) held behind this one.
	Waiting int64
}

// Parked lists the parked rows of schema's outbox, oldest first, at most limit (100 when
// limit <= 0).
func (w Writer) Parked(ctx context.Context, q pg.Querier, limit int) ([]ParkedRow, error) {
	if limit <= 0 {
		limit = 100
	}
	t := tables.For(w.schema())
	rows, err := q.Query(ctx, `SELECT o.id, o.outbox_id::text, o.topic, o.key, o.value, o.partition, o.attempts, coalesce(o.last_error, ''),
			o.created_at, coalesce(o.parked_at, o.created_at),
			(SELECT count(*) FROM `+t.Outbox+` b WHERE b.state = 'pending' AND b.topic = o.topic AND b.key = o.key)
		FROM `+t.Outbox+` o WHERE o.state = 'parked' ORDER BY o.id LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: list parked rows: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ParkedRow, error) {
		var p ParkedRow
		err := r.Scan(&p.ID, &p.OutboxID, &p.Topic, &p.Key, &p.Value, &p.Partition, &p.Attempts, &p.LastError,
			&p.CreatedAt, &p.ParkedAt, &p.Waiting)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: list parked rows: %w", err)
	}
	return out, nil
}

// Release puts parked row id back in the queue (for example once the topic exists or its
// max.message.bytes was raised), records the action in outbox_audit and wakes the relay, in
// the caller's transaction. The rows waiting behind it keep waiting until it is published.
// It returns an error wrapping ErrNotParked when id is not parked.
func (w Writer) ReleaseTx(ctx context.Context, tx pgx.Tx, id int64, reason, actor string) error {
	return w.resolveParked(ctx, tx, id, "release", `state = 'pending', parked_at = NULL`, reason, actor)
}

// Discard gives up on parked row id: it is never published, the rows waiting behind it flow
// again; the action is recorded in outbox_audit and the relay woken, in the caller's
// transaction. It returns an error wrapping ErrNotParked when id is not parked.
func (w Writer) DiscardTx(ctx context.Context, tx pgx.Tx, id int64, reason, actor string) error {
	return w.resolveParked(ctx, tx, id, "discard", `state = 'discarded', resolved_at = now()`, reason, actor)
}

func (w Writer) resolveParked(ctx context.Context, tx pgx.Tx, id int64, action, set, reason, actor string) error {
	schema := w.schema()
	t := tables.For(schema)
	var lastErr *string
	err := tx.QueryRow(ctx, `UPDATE `+t.Outbox+` o SET `+set+` FROM (SELECT id, last_error FROM `+t.Outbox+` WHERE id = $1 AND state = 'parked' FOR UPDATE) old
		WHERE o.id = old.id RETURNING old.last_error`, id).Scan(&lastErr)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("outbox row %d: %w", id, ErrNotParked)
	}
	if err != nil {
		return fmt.Errorf("outbox: %s row %d: %w", action, id, err)
	}
	_, err = tx.Exec(ctx, `INSERT INTO `+tables.For(schema).OutboxAudit+` (outbox_row, action, parked_error, reason, actor)
		VALUES ($1, $2, $3, $4, $5)`, id, action, lastErr, pg.SanitizeText(reason, 1024), pg.SanitizeText(actor, 256))
	if err != nil {
		return fmt.Errorf("outbox: audit %s of row %d: %w", action, id, err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_notify($1, '')`, Channel(schema)); err != nil {
		return fmt.Errorf("outbox: wake the relay: %w", err)
	}
	return nil
}

func (w Writer) schema() string { return pg.SchemaOr(w.Schema) }
