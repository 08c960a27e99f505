// Package offsetstore reads and writes kafkatx's processed watermarks, durable attempt
// counters and offset audit rows. The consumer loop and the operator command share it, so
// both sides of every rule run the same SQL.
package offsetstore

import (
	"context"
	"errors"
	"fmt"
	"github.com/kafkatx/kafkatx/internal/msgfmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/offsetstate"
	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/pg"
)

// TP is a topic partition.
type TP struct {
	Topic     string
	Partition int32
}

// String is topic[partition], the topic as msgfmt.Text writes it (escaped when it holds a
// control character), since it reaches operators' terminals.
func (tp TP) String() string { return fmt.Sprintf("%s[%d]", msgfmt.Text(tp.Topic), tp.Partition) }

// Watermark is one processed-watermark row.
type Watermark struct {
	TP
	// Next is the next offset to process.
	Next int64
	// First is the offset the group started this partition at.
	First int64
	// InflightEnd, when > Next, marks [Next, InflightEnd) as attempted by a batch that did
	// not commit; -1 when none.
	InflightEnd int64
	ReplayEpoch int
	UpdatedAt   time.Time
	// TopicID and ClusterID name the log the offsets count in: the topic's id (KIP-516, Kafka's
	// base64 form) and its cluster's id, as the consumer read them when it met the partition
	// (migration 009); "" when not recorded yet (a row older than the migration, or a broker
	// that gives no topic id).
	TopicID, ClusterID string
}

// Store runs the SQL for one schema.
type Store struct {
	t tables.Names
}

// New returns a Store for schema.
func New(schema string) *Store { return &Store{t: tables.For(schema)} }

// Tables returns the quoted table names.
func (s *Store) Tables() tables.Names { return s.t }

// Watermarks returns the rows of group for the given partitions (all partitions of all
// topics when tps is empty).
func (s *Store) Watermarks(ctx context.Context, q pg.Querier, group string, tps []TP) (map[TP]Watermark, error) {
	rows, err := q.Query(ctx, `SELECT topic, partition, next_offset, first_offset, coalesce(inflight_end, -1), replay_epoch, updated_at,
		coalesce(topic_id, ''), coalesce(cluster_id, '')
		FROM `+s.t.Watermarks+` WHERE group_id = $1 ORDER BY topic, partition`, group)
	if err != nil {
		return nil, fmt.Errorf("read watermarks: %w", err)
	}
	want := map[TP]bool{}
	for _, tp := range tps {
		want[tp] = true
	}
	out := map[TP]Watermark{}
	for rows.Next() {
		var w Watermark
		if err := rows.Scan(&w.Topic, &w.Partition, &w.Next, &w.First, &w.InflightEnd, &w.ReplayEpoch, &w.UpdatedAt, &w.TopicID, &w.ClusterID); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read watermarks: %w", err)
		}
		if len(want) == 0 || want[w.TP] {
			out[w.TP] = w
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read watermarks: %w", err)
	}
	return out, nil
}

// Init records the first watermark of a partition at start unless a row exists, and
// returns the row that is stored afterwards and whether this call created it.
func (s *Store) Init(ctx context.Context, q pg.Querier, group string, tp TP, start int64) (Watermark, bool, error) {
	tag, err := q.Exec(ctx, `INSERT INTO `+s.t.Watermarks+` (group_id, topic, partition, next_offset, first_offset)
		VALUES ($1, $2, $3, $4, $4) ON CONFLICT DO NOTHING`, group, tp.Topic, tp.Partition, start)
	if err != nil {
		return Watermark{}, false, fmt.Errorf("record first watermark %s: %w", tp, err)
	}
	ws, err := s.Watermarks(ctx, q, group, []TP{tp})
	if err != nil {
		return Watermark{}, false, err
	}
	w, ok := ws[tp]
	if !ok {
		return Watermark{}, false, fmt.Errorf("record first watermark %s: row vanished", tp)
	}
	return w, tag.RowsAffected() == 1, nil
}

// ErrFenced means the watermark was not at the expected offset: another owner advanced it
// (a rebalance or a zombie), so the caller's transaction must roll back (invariant 6).
var ErrFenced = errors.New("watermark fenced: another consumer advanced it")

// inLog is the compare-and-set's second condition: the watermark row still counts the log
// the caller reads, topic id $n ("" unknown to the caller; a row without a topic id is
// unknown too, and FillLogIdentity records one at first contact). A row moved onto another
// log under a running consumer — AdoptLog by a consumer of another cluster behind the same
// group and topic name, whose group Kafka does not show to this one — no longer matches, even
// at an offset that happens to equal the caller's: the caller is fenced (ErrFenced) instead of
// applying its own log's records under the other log's offsets.
func inLog(n int) string {
	p := fmt.Sprintf("$%d::text", n)
	return `(` + p + ` = '' OR topic_id IS NULL OR topic_id = ` + p + `)`
}

// Advance moves the watermark from `from` to `to` with compare-and-set, and sets the
// in-flight marker to inflightEnd (≤ to clears it). logID is the topic id of the log the
// caller reads ("": not checked). It returns ErrFenced when the row is not at from, or
// counts another log (inLog).
func (s *Store) Advance(ctx context.Context, q pg.Querier, group string, tp TP, logID string, from, to, inflightEnd int64) error {
	var ie *int64
	if inflightEnd > to {
		ie = &inflightEnd
	}
	tag, err := q.Exec(ctx, `UPDATE `+s.t.Watermarks+` SET next_offset = $5, inflight_end = $6, updated_at = now()
		WHERE group_id = $1 AND topic = $2 AND partition = $3 AND next_offset = $4 AND `+inLog(7),
		group, tp.Topic, tp.Partition, from, to, ie, logID)
	if err != nil {
		return fmt.Errorf("advance watermark %s %d→%d: %w", tp, from, to, err)
	}
	if tag.RowsAffected() == 0 {
		return ErrFenced
	}
	return nil
}

// AdvanceXID is Advance that also returns the id of q's transaction (txid_current(), the
// 64-bit form txid_status accepts), so that a COMMIT whose answer is lost can be settled from
// the database's own record (TxStatus) rather than guessed. The caller commits next; nothing
// of kafkatx cancels that COMMIT while it waits for a synchronous standby (docs/deployment.md,
// "What a failover costs"): PostgreSQL disarms statement_timeout before the commit itself,
// and pgx ends a cancelled context by closing the connection, sending no cancel request.
func (s *Store) AdvanceXID(ctx context.Context, q pg.Querier, group string, tp TP, logID string, from, to, inflightEnd int64) (xid int64, err error) {
	var ie *int64
	if inflightEnd > to {
		ie = &inflightEnd
	}
	err = q.QueryRow(ctx, `UPDATE `+s.t.Watermarks+` SET next_offset = $5, inflight_end = $6, updated_at = now()
		WHERE group_id = $1 AND topic = $2 AND partition = $3 AND next_offset = $4 AND `+inLog(7)+` RETURNING txid_current()`,
		group, tp.Topic, tp.Partition, from, to, ie, logID).Scan(&xid)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, ErrFenced
	}
	if err != nil {
		return 0, fmt.Errorf("advance watermark %s %d→%d: %w", tp, from, to, err)
	}
	return xid, nil
}

// TxStatus returns txid_status(xid): "committed", "aborted", "in progress" (a COMMIT still
// waiting — for a synchronous standby, say — reads as in progress), or "" when the
// transaction is too old for the server to know.
func TxStatus(ctx context.Context, q pg.Querier, xid int64) (string, error) {
	var st *string
	if err := q.QueryRow(ctx, `SELECT txid_status($1)`, xid).Scan(&st); err != nil {
		return "", fmt.Errorf("txid_status: %w", err)
	}
	if st == nil {
		return "", nil
	}
	return *st, nil
}

// MarkInflight durably records that offsets [at, end) are about to be attempted, so that a
// crash while they run counts as one attempt for each. logID is as Advance's. It returns
// ErrFenced when the watermark is not at `at`, or counts another log.
func (s *Store) MarkInflight(ctx context.Context, q pg.Querier, group string, tp TP, logID string, at, end int64) error {
	tag, err := q.Exec(ctx, `UPDATE `+s.t.Watermarks+` SET inflight_end = $5
		WHERE group_id = $1 AND topic = $2 AND partition = $3 AND next_offset = $4 AND `+inLog(6),
		group, tp.Topic, tp.Partition, at, end, logID)
	if err != nil {
		return fmt.Errorf("mark in-flight %s [%d, %d): %w", tp, at, end, err)
	}
	if tag.RowsAffected() == 0 {
		return ErrFenced
	}
	return nil
}

// Attempt is the durable attempt state of one offset.
type Attempt struct {
	Offset         int64
	Attempts       int
	FirstFailureAt time.Time // zero when no try has failed yet (only crashes)
	LastFailureAt  time.Time
	ErrorClass     string
	ErrorMessage   string
	Stack          string
}

// Attempts returns the attempt rows of a partition at or above offset from.
func (s *Store) Attempts(ctx context.Context, q pg.Querier, group string, tp TP, from int64) (map[int64]Attempt, error) {
	rows, err := q.Query(ctx, `SELECT "offset", attempts, coalesce(first_failure_at, 'epoch'), coalesce(last_failure_at, 'epoch'),
		coalesce(error_class, ''), coalesce(error_message, ''), coalesce(stack, '')
		FROM `+s.t.Attempts+` WHERE group_id = $1 AND topic = $2 AND partition = $3 AND "offset" >= $4`,
		group, tp.Topic, tp.Partition, from)
	if err != nil {
		return nil, fmt.Errorf("read attempts %s: %w", tp, err)
	}
	out := map[int64]Attempt{}
	for rows.Next() {
		var a Attempt
		if err := rows.Scan(&a.Offset, &a.Attempts, &a.FirstFailureAt, &a.LastFailureAt, &a.ErrorClass, &a.ErrorMessage, &a.Stack); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read attempts %s: %w", tp, err)
		}
		if a.FirstFailureAt.Unix() == 0 {
			a.FirstFailureAt = time.Time{}
		}
		if a.LastFailureAt.Unix() == 0 {
			a.LastFailureAt = time.Time{}
		}
		out[a.Offset] = a
	}
	return out, rows.Err()
}

// BeginAttempt durably records that try number n of offset is about to run, its outcome
// unknown (error_class NULL) until RecordFailure or the commit that deletes the row: a crash
// during the try leaves it so.
func (s *Store) BeginAttempt(ctx context.Context, q pg.Querier, group string, tp TP, offset int64, n int) error {
	_, err := q.Exec(ctx, `INSERT INTO `+s.t.Attempts+` (group_id, topic, partition, "offset", attempts)
		VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (group_id, topic, partition, "offset") DO UPDATE SET attempts = excluded.attempts, error_class = NULL, updated_at = now()`,
		group, tp.Topic, tp.Partition, offset, n)
	if err != nil {
		return fmt.Errorf("record attempt %d of %s@%d: %w", n, tp, offset, err)
	}
	return nil
}

// RecordFailure stores try n's failure of offset.
func (s *Store) RecordFailure(ctx context.Context, q pg.Querier, group string, tp TP, offset int64, n int, class, msg, stack string) error {
	_, err := q.Exec(ctx, `INSERT INTO `+s.t.Attempts+` AS a (group_id, topic, partition, "offset", attempts, first_failure_at, last_failure_at, error_class, error_message, stack)
		VALUES ($1, $2, $3, $4, $5, now(), now(), $6, $7, $8)
		ON CONFLICT (group_id, topic, partition, "offset") DO UPDATE SET attempts = greatest(a.attempts, excluded.attempts),
			first_failure_at = coalesce(a.first_failure_at, excluded.first_failure_at), last_failure_at = excluded.last_failure_at,
			error_class = excluded.error_class, error_message = excluded.error_message, stack = excluded.stack, updated_at = now()`,
		group, tp.Topic, tp.Partition, offset, n, class, msg, nullIfEmpty(stack))
	if err != nil {
		return fmt.Errorf("record failure of attempt %d of %s@%d: %w", n, tp, offset, err)
	}
	return nil
}

// DeleteAttempts removes the attempt rows of offsets in [from, to).
func (s *Store) DeleteAttempts(ctx context.Context, q pg.Querier, group string, tp TP, from, to int64) error {
	_, err := q.Exec(ctx, `DELETE FROM `+s.t.Attempts+` WHERE group_id = $1 AND topic = $2 AND partition = $3 AND "offset" >= $4 AND "offset" < $5`,
		group, tp.Topic, tp.Partition, from, to)
	if err != nil {
		return fmt.Errorf("delete attempts %s [%d, %d): %w", tp, from, to, err)
	}
	return nil
}

// DeleteAttemptsAt removes the attempt rows of exactly offsets (a unit of one lane, whose
// range may hold other lanes' offsets).
func (s *Store) DeleteAttemptsAt(ctx context.Context, q pg.Querier, group string, tp TP, offsets []int64) error {
	_, err := q.Exec(ctx, `DELETE FROM `+s.t.Attempts+` WHERE group_id = $1 AND topic = $2 AND partition = $3 AND "offset" = ANY($4)`,
		group, tp.Topic, tp.Partition, offsets)
	if err != nil {
		return fmt.Errorf("delete attempts %s %v: %w", tp, offsets, err)
	}
	return nil
}

// MarkDoneXID records in q's transaction that offsets (above the watermark, applied by this
// transaction) are done, and returns the id of q's transaction (txid_current()) in the same
// round trip, so that a COMMIT whose answer is lost is settled by TxStatus. It is fenced: the
// watermark row is read FOR SHARE and must not have passed the lowest of offsets, and an
// offset another owner already recorded is not recorded again; either way it returns
// ErrFenced, and the caller rolls back.
func (s *Store) MarkDoneXID(ctx context.Context, q pg.Querier, group string, tp TP, offsets []int64) (xid int64, err error) {
	low := offsets[0]
	for _, o := range offsets {
		low = min(low, o)
	}
	var n int64
	err = q.QueryRow(ctx, `WITH ins AS (INSERT INTO `+s.t.DoneOffsets+` (group_id, topic, partition, "offset")
		SELECT $1, $2, $3, o FROM unnest($4::bigint[]) AS o
		WHERE EXISTS (SELECT 1 FROM `+s.t.Watermarks+` WHERE group_id = $1 AND topic = $2 AND partition = $3 AND next_offset <= $5 FOR SHARE)
		ON CONFLICT DO NOTHING RETURNING 1)
		SELECT count(*), txid_current() FROM ins`,
		group, tp.Topic, tp.Partition, offsets, low).Scan(&n, &xid)
	if err != nil {
		return 0, fmt.Errorf("mark done %s %v: %w", tp, offsets, err)
	}
	if n != int64(len(offsets)) {
		return 0, ErrFenced
	}
	return xid, nil
}

// Done returns the offsets at or above from recorded done (MarkDoneXID), in order.
func (s *Store) Done(ctx context.Context, q pg.Querier, group string, tp TP, from int64) ([]int64, error) {
	rows, err := q.Query(ctx, `SELECT "offset" FROM `+s.t.DoneOffsets+` WHERE group_id = $1 AND topic = $2 AND partition = $3 AND "offset" >= $4 ORDER BY 1`,
		group, tp.Topic, tp.Partition, from)
	if err != nil {
		return nil, fmt.Errorf("read done offsets %s: %w", tp, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("read done offsets %s: %w", tp, err)
	}
	return out, nil
}

// DeleteDone removes the done rows of tp below `below` (the watermark passed them) — or all of
// them when below < 0 (an operator reset).
func (s *Store) DeleteDone(ctx context.Context, q pg.Querier, group string, tp TP, below int64) error {
	var err error
	if below < 0 {
		_, err = q.Exec(ctx, `DELETE FROM `+s.t.DoneOffsets+` WHERE group_id = $1 AND topic = $2 AND partition = $3`, group, tp.Topic, tp.Partition)
	} else {
		_, err = q.Exec(ctx, `DELETE FROM `+s.t.DoneOffsets+` WHERE group_id = $1 AND topic = $2 AND partition = $3 AND "offset" < $4`, group, tp.Topic, tp.Partition, below)
	}
	if err != nil {
		return fmt.Errorf("delete done offsets %s: %w", tp, err)
	}
	return nil
}

func nullIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// Database reads which database q is connected to (offsetstate.Database): the cluster's
// system identifier, the database's OID and the timeline of the WAL insert position (0 on a
// server in recovery, which has none). Every role may run it (pg_control_system and
// pg_walfile_name need no privilege).
func Database(ctx context.Context, q pg.Querier) (offsetstate.Database, error) {
	var d offsetstate.Database
	var oid, tl int64
	err := q.QueryRow(ctx, `SELECT (SELECT system_identifier::text FROM pg_control_system()),
		(SELECT oid::bigint FROM pg_database WHERE datname = current_database()),
		CASE WHEN pg_is_in_recovery() THEN 0
		     ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint END`).Scan(&d.System, &oid, &tl)
	if err != nil {
		return d, fmt.Errorf("read the database's identity: %w", err)
	}
	d.OID, d.Timeline = uint32(oid), uint32(tl)
	return d, nil
}
