package offsetstore

import (
	"context"
	"fmt"
	"strconv"

	"github.com/kafkatx/kafkatx/pg"
)

// FillLogIdentity records topicID and clusterID on the watermark row of tp where they are
// not recorded yet (a row older than migration 009, or a first run); recorded ids are left
// as they are — a different one is a changed log, which only AdoptLog replaces. An empty id
// (the broker gave none) is not recorded. The partition's dead letters of unknown log
// (topic_id and cluster_id ”: written before the watermark had ids) are placed in the same
// log in the same statement: they were read from the log the watermark counted in.
func (s *Store) FillLogIdentity(ctx context.Context, q pg.Querier, group string, tp TP, topicID, clusterID string) error {
	_, err := q.Exec(ctx, `WITH w AS (UPDATE `+s.t.Watermarks+` SET topic_id = coalesce(topic_id, nullif($4, '')), cluster_id = coalesce(cluster_id, nullif($5, ''))
		WHERE group_id = $1 AND topic = $2 AND partition = $3
		  AND ((topic_id IS NULL AND $4 <> '') OR (cluster_id IS NULL AND $5 <> ''))
		RETURNING coalesce(topic_id, '') AS topic_id, coalesce(cluster_id, '') AS cluster_id)
		UPDATE `+s.t.DeadLetters+` d SET topic_id = w.topic_id, cluster_id = w.cluster_id FROM w
		WHERE d.group_id = $1 AND d.topic = $2 AND d.partition = $3 AND d.topic_id = '' AND d.cluster_id = ''`,
		group, tp.Topic, tp.Partition, topicID, clusterID)
	if err != nil {
		return fmt.Errorf("record the topic and cluster ids of %s: %w", tp, err)
	}
	return nil
}

// AdoptLog moves the watermark of tp from `from` (an offset of the old log) to `to` (an
// offset of the new one) with compare-and-set, starts the partition's history there
// (first_offset = to), records the new log's ids, and drops the
// partition's attempt and done rows (offsets of the old log), all in q's transaction — every
// row keyed by an offset of the old log is dropped or kept apart (migration 011): an old
// attempt count never counts against the new log's message at its offset, an old done mark
// never skips it. Dead letters stay, each naming its log (dlq.DeadLetter.TopicID). The replay
// epoch stays: a business idempotency key claimed in the old log (scope "group/epoch") still
// counts — the same event mirrored into another cluster, or re-published into the recreated
// topic, is not applied twice — while the outbox ids derived from the new log's messages
// differ from the old log's, being scoped by the topic id (engine: worker.scopes). auditID is the log_adopted
// row that explains the move: the watermarks trigger (migration 004) is told through the
// transaction-local setting kafkatx.audit_id, so a move back is not reported as unexplained.
// It returns ErrFenced when the row is not at from.
func (s *Store) AdoptLog(ctx context.Context, q pg.Querier, group string, tp TP, from, to int64, topicID, clusterID string, auditID int64) error {
	if _, err := q.Exec(ctx, `SELECT set_config('kafkatx.audit_id', $1, true)`, strconv.FormatInt(auditID, 10)); err != nil {
		return fmt.Errorf("mark transaction as audited: %w", err)
	}
	tag, err := q.Exec(ctx, `UPDATE `+s.t.Watermarks+` SET next_offset = $5, first_offset = $5, inflight_end = NULL,
			topic_id = nullif($6, ''), cluster_id = nullif($7, ''), updated_at = now()
		WHERE group_id = $1 AND topic = $2 AND partition = $3 AND next_offset = $4`,
		group, tp.Topic, tp.Partition, from, to, topicID, clusterID)
	if err != nil {
		return fmt.Errorf("adopt the new log of %s at %d: %w", tp, to, err)
	}
	if tag.RowsAffected() == 0 {
		return ErrFenced
	}
	if _, err := q.Exec(ctx, `DELETE FROM `+s.t.Attempts+` WHERE group_id = $1 AND topic = $2 AND partition = $3`, group, tp.Topic, tp.Partition); err != nil {
		return fmt.Errorf("drop the old log's attempts of %s: %w", tp, err)
	}
	return s.DeleteDone(ctx, q, group, tp, -1)
}

// Topics returns the topics group has a watermark on.
func (s *Store) Topics(ctx context.Context, q pg.Querier, group string) (map[string]bool, error) {
	rows, err := q.Query(ctx, `SELECT DISTINCT topic FROM `+s.t.Watermarks+` WHERE group_id = $1`, group)
	if err != nil {
		return nil, fmt.Errorf("read the group's topics: %w", err)
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			return nil, fmt.Errorf("read the group's topics: %w", err)
		}
		out[t] = true
	}
	return out, rows.Err()
}
