package dlq

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/pg"
)

// ErrNotFound is returned by Get, MarkReplayedTx and DiscardTx for an id with no dead letter.
var ErrNotFound = errors.New("dlq: no such dead letter")

// Filter selects dead letters for List. Empty fields match everything.
type Filter struct {
	// Status is StatusNew, StatusReplayed or StatusDiscarded; "" means any.
	Status string
	Group  string
	Topic  string
	// AfterID lists only ids greater than it (for paging). Defaults to 0.
	AfterID int64
	// Limit is the most rows returned. Defaults to 100.
	Limit int
}

const columns = `id, group_id, topic, partition, "offset", key, value, header_keys, header_values, message_time,
	error_class, error_message, coalesce(stack, ''), attempts, first_failure_at, last_failure_at, status, created_at, resolved_at, replay_epoch,
	topic_id, cluster_id`

// List returns the dead letters matching f, lowest id first.
func List(ctx context.Context, q pg.Querier, schema string, f Filter) ([]DeadLetter, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	rows, err := q.Query(ctx, `SELECT `+columns+` FROM `+tables.For(schema).DeadLetters+`
		WHERE ($1 = '' OR status = $1) AND ($2 = '' OR group_id = $2) AND ($3 = '' OR topic = $3) AND id > $4
		ORDER BY id LIMIT $5`, f.Status, f.Group, f.Topic, f.AfterID, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("dlq: list dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanDeadLetter)
	if err != nil {
		return nil, fmt.Errorf("dlq: list dead letters: %w", err)
	}
	return out, nil
}

// Get returns the dead letter id, or an error wrapping ErrNotFound.
func Get(ctx context.Context, q pg.Querier, schema string, id int64) (*DeadLetter, error) {
	return get(ctx, q, schema, id, "")
}

func get(ctx context.Context, q pg.Querier, schema string, id int64, suffix string) (*DeadLetter, error) {
	rows, err := q.Query(ctx, `SELECT `+columns+` FROM `+tables.For(schema).DeadLetters+` WHERE id = $1`+suffix, id)
	if err != nil {
		return nil, fmt.Errorf("dlq: read dead letter %d: %w", id, err)
	}
	d, err := pgx.CollectExactlyOneRow(rows, scanDeadLetter)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("dead letter %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("dlq: read dead letter %d: %w", id, err)
	}
	return &d, nil
}

func scanDeadLetter(row pgx.CollectableRow) (DeadLetter, error) {
	return scanDeadLetterExtra(row)
}
