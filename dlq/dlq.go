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
	// ReplayEpoch is the partition's replay epoch (watermarks.replay_epoch) of the latest
	// failure: 0 before any operator replay or log adoption.
	ReplayEpoch int
	// TopicID and ClusterID name the log the message was read from (docs/offsets.md, "Which
	// log a watermark is in"): the topic id (KIP-516, Kafka's base64 form) and cluster id
	// recorded with the partition's watermark when the dead letter was written; "" when
	// unknown (a first run, a broker before Kafka 2.8, a row from before migration 011 that
	// could not be placed). InsertTx sets them; a value given by the caller is ignored.
	TopicID   string
	ClusterID string
}

// InsertTx writes d in the caller's transaction and returns its id. A dead letter belongs to
// the log the partition's watermark names in that transaction (watermarks.topic_id and
// cluster_id, read by the same statement; "" without a watermark row or ids): InsertTx sets
// d.TopicID and d.ClusterID to them. The first dead letter of a (group, topic, partition,
// offset) in one log inserts a row (inserted=true) — a message of another log at the same
// offset (the topic recreated and adopted) gets a row of its own, the old log's row untouched.
// A later one in the same log — the message failed again after an operator replay moved the
// watermark back over it — updates that row
// (inserted=false): attempts, error class, message and stack, last failure, the record's
// bytes and ReplayEpoch take d's values, status goes back to StatusNew and resolved_at to
// NULL; first_failure_at and created_at stay. The consumer calls it in the transaction that
// advances the watermark past the offset, so each call is one failure. Error text and stack
// are sanitized (valid UTF-8, no NUL) and bounded, so the write never fails on the bytes that
// made the handler fail.
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
	// xmax = 0 only on a row this statement inserted (the usual upsert test).
	err = tx.QueryRow(ctx, `INSERT INTO `+t.DeadLetters+` AS d (group_id, topic, partition, "offset", key, value, header_keys, header_values,
			message_time, error_class, error_message, stack, attempts, first_failure_at, last_failure_at, replay_epoch, topic_id, cluster_id)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
			coalesce((SELECT w.topic_id FROM `+t.Watermarks+` w WHERE w.group_id = $1 AND w.topic = $2 AND w.partition = $3), ''),
			coalesce((SELECT w.cluster_id FROM `+t.Watermarks+` w WHERE w.group_id = $1 AND w.topic = $2 AND w.partition = $3), ''))
		ON CONFLICT (group_id, topic, partition, "offset", cluster_id, topic_id) DO UPDATE SET
			key = EXCLUDED.key, value = EXCLUDED.value, header_keys = EXCLUDED.header_keys, header_values = EXCLUDED.header_values,
			message_time = EXCLUDED.message_time, error_class = EXCLUDED.error_class, error_message = EXCLUDED.error_message,
			stack = EXCLUDED.stack, attempts = EXCLUDED.attempts, last_failure_at = EXCLUDED.last_failure_at,
			replay_epoch = EXCLUDED.replay_epoch, status = 'new', resolved_at = NULL
		RETURNING id, (xmax = 0), topic_id, cluster_id`,
		d.Group, d.Topic, d.Partition, d.Offset, d.Key, d.Value, hk, hv, ts,
		pg.SanitizeText(d.ErrorClass, 64), pg.SanitizeText(d.ErrorMessage, MaxErrorMessageBytes), nullIfEmpty(pg.SanitizeText(d.Stack, MaxStackBytes)),
		d.Attempts, d.FirstFailureAt, d.LastFailureAt, d.ReplayEpoch).Scan(&id, &inserted, &d.TopicID, &d.ClusterID)
	if err != nil {
		return 0, false, fmt.Errorf("dlq: write dead letter %s[%d]@%d: %w", d.Topic, d.Partition, d.Offset, err)
	}
	return id, inserted, nil
}

func nullIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}
