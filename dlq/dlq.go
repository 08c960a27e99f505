// Package dlq stores and manages dead letters: messages kafkatx gave up on, kept in
// PostgreSQL with their full context (original position, key, value and headers byte for
// byte, attempts, first and last failure, error class and message, bounded stack).
//
// The consumer writes dead letters with InsertTx in the same transaction that advances the
// partition's watermark (docs/design.md#invariant-4). The package does not import Kafka.
package dlq

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/pg"
)

// Status values of a dead letter.
const (
	StatusNew       = "new"
	StatusReplayed  = "replayed"
	StatusDiscarded = "discarded"
)

// Limits on stored text, in bytes. Longer text is cut at a UTF-8 boundary.
const (
	MaxErrorMessageBytes = 4 << 10
	MaxStackBytes        = 16 << 10
)

// Header is one original record header, kept byte for byte.
type Header struct {
	Key   string
	Value []byte
}

// DeadLetter is one dead-lettered message.
type DeadLetter struct {
	ID             int64
	Group          string
	Topic          string
	Partition      int32
	Offset         int64
	Key            []byte // nil for a nil key
	Value          []byte // nil for a nil value (a tombstone)
	Headers        []Header
	Timestamp      time.Time // the original record's timestamp
	ErrorClass     string
	ErrorMessage   string
	Stack          string
	Attempts       int
	FirstFailureAt time.Time
	LastFailureAt  time.Time
	Status         string
	CreatedAt      time.Time
	ResolvedAt     *time.Time
}

// InsertTx writes d in the caller's transaction and returns its id. A dead letter for the
// same (group, topic, partition, offset) is written once: a second call returns the first
// row's id and inserted=false. Error text and stack are sanitized (valid UTF-8, no NUL) and
// bounded, so the write never fails on the bytes that made the handler fail.
func InsertTx(ctx context.Context, tx pgx.Tx, schema string, d *DeadLetter) (id int64, inserted bool, err error) {
	t := tables.For(schema)
	hk := make([][]byte, len(d.Headers))
	hv := make([][]byte, len(d.Headers))
	for i, h := range d.Headers {
		hk[i] = []byte(h.Key)
		hv[i] = h.Value
	}
	var ts *time.Time
	if !d.Timestamp.IsZero() {
		ts = &d.Timestamp
	}
	err = tx.QueryRow(ctx, `INSERT INTO `+t.DeadLetters+` (group_id, topic, partition, "offset", key, value, header_keys, header_values,
			message_time, error_class, error_message, stack, attempts, first_failure_at, last_failure_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
		ON CONFLICT (group_id, topic, partition, "offset") DO NOTHING RETURNING id`,
		d.Group, d.Topic, d.Partition, d.Offset, d.Key, d.Value, hk, hv, ts,
		pg.SanitizeText(d.ErrorClass, 64), pg.SanitizeText(d.ErrorMessage, MaxErrorMessageBytes), nullIfEmpty(pg.SanitizeText(d.Stack, MaxStackBytes)),
		d.Attempts, d.FirstFailureAt, d.LastFailureAt).Scan(&id)
	if err == pgx.ErrNoRows {
		err = tx.QueryRow(ctx, `SELECT id FROM `+t.DeadLetters+` WHERE group_id = $1 AND topic = $2 AND partition = $3 AND "offset" = $4`,
			d.Group, d.Topic, d.Partition, d.Offset).Scan(&id)
		if err != nil {
			return 0, false, fmt.Errorf("dlq: find existing dead letter: %w", err)
		}
		return id, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("dlq: insert dead letter %s[%d]@%d: %w", d.Topic, d.Partition, d.Offset, err)
	}
	return id, true, nil
}

func nullIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}
