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

// ParkedSelection selects parked rows for a bulk release or discard (ReleaseAllTx,
// DiscardAllTx) and for its dry run (ParkedSummary).
type ParkedSelection struct {
	// Topic is the only topic acted on; "" selects every topic.
	Topic string
	// MaxID bounds the selection to rows with id <= MaxID; 0 means no bound. Pass the
	// MaxID of the dry run's summary so the action covers exactly the rows it printed, not a
	// row the relay parked in between.
	MaxID int64
}

// ParkedTopicSummary is one topic's line of a bulk action's dry run.
type ParkedTopicSummary struct {
	Topic string `json:"topic"`
	// Rows is the number of parked rows of Topic selected.
	Rows int64 `json:"rows"`
	// FirstID and LastID are the lowest and highest selected outbox row ids.
	FirstID int64 `json:"first_id"`
	LastID  int64 `json:"last_id"`
	// OldestParkedAt is when the longest-parked selected row was parked.
	OldestParkedAt time.Time `json:"oldest_parked_at"`
}

// ParkedSummary is the dry run of a bulk release or discard: per topic, the parked rows
// sel selects, in topic order. It changes nothing. MaxIDOf(summary) is the bound to pass to
// the action.
func (w Writer) ParkedSummary(ctx context.Context, q pg.Querier, sel ParkedSelection) ([]ParkedTopicSummary, error) {
	t := tables.For(w.schema())
	rows, err := q.Query(ctx, `SELECT topic, count(*), min(id), max(id), min(coalesce(parked_at, created_at))
		FROM `+t.Outbox+` WHERE state = 'parked' AND ($1 = '' OR topic = $1) AND ($2::bigint = 0 OR id <= $2::bigint)
		GROUP BY topic ORDER BY topic`, sel.Topic, sel.MaxID)
	if err != nil {
		return nil, fmt.Errorf("outbox: summarize parked rows: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ParkedTopicSummary, error) {
		var s ParkedTopicSummary
		err := r.Scan(&s.Topic, &s.Rows, &s.FirstID, &s.LastID, &s.OldestParkedAt)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: summarize parked rows: %w", err)
	}
	return out, nil
}

// MaxIDOf returns the highest LastID of a summary (0 for an empty one): the ParkedSelection
// bound that makes an action match its dry run.
func MaxIDOf(summary []ParkedTopicSummary) int64 {
	var m int64
	for _, s := range summary {
		m = max(m, s.LastID)
	}
	return m
}

// ReleaseAllTx puts every parked row sel selects back in the queue, in the caller's
// transaction, in one statement: each row gets its outbox_audit row (action release, its
// parked error, reason, actor), and the relay is woken. It returns the number of rows
// released (0 when none is parked: not an error). Rows of one key stay in id order, so the
// relay publishes them in their original order. Reason is cut to 1 KiB and actor to 256
// bytes; an empty reason is refused.
func (w Writer) ReleaseAllTx(ctx context.Context, tx pgx.Tx, sel ParkedSelection, reason, actor string) (int64, error) {
	return w.resolveAllParked(ctx, tx, sel, "release", `state = 'pending', parked_at = NULL`, reason, actor)
}

// DiscardAllTx gives up on every parked row sel selects, in the caller's transaction, in
// one statement: they are never published, the rows waiting behind them flow again, and each
// gets its outbox_audit row (action discard). It returns the number of rows discarded. An
// empty reason is refused.
func (w Writer) DiscardAllTx(ctx context.Context, tx pgx.Tx, sel ParkedSelection, reason, actor string) (int64, error) {
	return w.resolveAllParked(ctx, tx, sel, "discard", `state = 'discarded', resolved_at = now()`, reason, actor)
}

// ErrNoReason is returned by the bulk actions when no reason is given: every operator action
// is audited with why.
var ErrNoReason = errors.New("outbox: a reason is required (recorded in outbox_audit)")

func (w Writer) resolveAllParked(ctx context.Context, tx pgx.Tx, sel ParkedSelection, action, set, reason, actor string) (int64, error) {
	if reason == "" {
		return 0, ErrNoReason
	}
	schema := w.schema()
	t := tables.For(schema)
	var n int64
	err := tx.QueryRow(ctx, `WITH old AS (
			SELECT id, last_error FROM `+t.Outbox+`
			WHERE state = 'parked' AND ($1 = '' OR topic = $1) AND ($2::bigint = 0 OR id <= $2::bigint) ORDER BY id FOR UPDATE),
		moved AS (
			UPDATE `+t.Outbox+` o SET `+set+` FROM old WHERE o.id = old.id RETURNING o.id, old.last_error),
		audit AS (
			INSERT INTO `+t.OutboxAudit+` (outbox_row, action, parked_error, reason, actor)
			SELECT id, $3, last_error, $4, $5 FROM moved ORDER BY id RETURNING 1)
		SELECT count(*) FROM audit`,
		sel.Topic, sel.MaxID, action, pg.SanitizeText(reason, 1024), pg.SanitizeText(actor, 256)).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("outbox: %s parked rows: %w", action, err)
	}
	if n == 0 {
		return 0, nil
	}
	if _, err := tx.Exec(ctx, `SELECT pg_notify($1, '')`, Channel(schema)); err != nil {
		return 0, fmt.Errorf("outbox: wake the relay: %w", err)
	}
	return n, nil
}
