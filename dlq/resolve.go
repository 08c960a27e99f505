package dlq

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/pg"
)

// Operator actions on a dead letter, as recorded in the dlq_audit table.
const (
	ActionReplay  = "replay"
	ActionDiscard = "discard"
)

// ErrResolved is returned by MarkReplayedTx and DiscardTx for a dead letter that is no longer
// StatusNew (already replayed or discarded), unless Action.Again is set.
var ErrResolved = errors.New("dlq: dead letter already resolved")

// Action describes one operator action for the audit trail.
type Action struct {
	// Reason is why the operator acted (free text, sanitized, at most 1 KiB).
	Reason string
	// Actor names who acted (for example user@host).
	Actor string
	// ToTopic is the topic a replay published to.
	ToTopic string
	// OutboxRow is the id of the outbox row a replay wrote; 0 when none.
	OutboxRow int64
	// Again allows replaying a dead letter that was already replayed (never a discarded one).
	Again bool
}

// AuditEntry is one dlq_audit row.
type AuditEntry struct {
	ID           int64     `json:"id"`
	DeadLetterID int64     `json:"dead_letter_id"`
	Action       string    `json:"action"`
	ToTopic      string    `json:"to_topic,omitempty"`
	OutboxRow    int64     `json:"outbox_row,omitempty"`
	Reason       string    `json:"reason"`
	Actor        string    `json:"actor"`
	At           time.Time `json:"at"`
}

// MarkReplayedTx sets dead letter id to StatusReplayed and records the replay in the audit
// table, in the caller's transaction (which it never commits): the same transaction that
// writes the replayed record to the outbox. It returns an error wrapping ErrNotFound, or
// ErrResolved when the dead letter is not new (replayed again only with a.Again).
func MarkReplayedTx(ctx context.Context, tx pgx.Tx, schema string, id int64, a Action) error {
	return resolve(ctx, tx, schema, id, ActionReplay, StatusReplayed, a)
}

// DiscardTx sets dead letter id to StatusDiscarded and records it in the audit table, in the
// caller's transaction. It returns an error wrapping ErrNotFound, or ErrResolved when the
// dead letter is not new.
func DiscardTx(ctx context.Context, tx pgx.Tx, schema string, id int64, a Action) error {
	a.Again = false
	return resolve(ctx, tx, schema, id, ActionDiscard, StatusDiscarded, a)
}

func resolve(ctx context.Context, tx pgx.Tx, schema string, id int64, action, status string, a Action) error {
	t := tables.For(schema)
	d, err := get(ctx, tx, schema, id, " FOR UPDATE")
	if err != nil {
		return err
	}
	if d.Status != StatusNew && !(a.Again && d.Status == StatusReplayed) {
		return fmt.Errorf("dead letter %d is %s: %w", id, d.Status, ErrResolved)
	}
	if _, err := tx.Exec(ctx, `UPDATE `+t.DeadLetters+` SET status = $2, resolved_at = now() WHERE id = $1`, id, status); err != nil {
		return fmt.Errorf("dlq: mark dead letter %d %s: %w", id, status, err)
	}
	var outboxRow *int64
	if a.OutboxRow != 0 {
		outboxRow = &a.OutboxRow
	}
	_, err = tx.Exec(ctx, `INSERT INTO `+tables.For(schema).DLQAudit+`
		(dead_letter_id, action, to_topic, outbox_row, reason, actor) VALUES ($1, $2, $3, $4, $5, $6)`,
		id, action, nullIfEmpty(a.ToTopic), outboxRow, pg.SanitizeText(a.Reason, 1024), pg.SanitizeText(a.Actor, 256))
	if err != nil {
		return fmt.Errorf("dlq: audit %s of dead letter %d: %w", action, id, err)
	}
	return nil
}

// Audit returns the audit trail of dead letter id, oldest first.
func Audit(ctx context.Context, q pg.Querier, schema string, id int64) ([]AuditEntry, error) {
	rows, err := q.Query(ctx, `SELECT id, dead_letter_id, action, coalesce(to_topic, ''), coalesce(outbox_row, 0), reason, actor, at
		FROM `+tables.For(schema).DLQAudit+` WHERE dead_letter_id = $1 ORDER BY id`, id)
	if err != nil {
		return nil, fmt.Errorf("dlq: read audit of dead letter %d: %w", id, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (AuditEntry, error) {
		var e AuditEntry
		err := r.Scan(&e.ID, &e.DeadLetterID, &e.Action, &e.ToTopic, &e.OutboxRow, &e.Reason, &e.Actor, &e.At)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("dlq: read audit of dead letter %d: %w", id, err)
	}
	return out, nil
}
