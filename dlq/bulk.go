package dlq

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/outbox"
	"github.com/kafkatx/kafkatx/pg"
)

// Selection selects dead letters for a bulk replay or discard (ReplayAllTx, DiscardAllTx)
// and for its dry run (Summarize). Empty fields match everything; only StatusNew dead
// letters are selected, and StatusReplayed ones too when Again is set.
type Selection struct {
	Group      string // consumer group
	Topic      string // original topic
	ErrorClass string // error_class, as `dlq list` prints it (permanent, max_attempts, panic, ...)
	// Since and Until bound the time of the latest failure (last_failure_at) to
	// [Since, Until); a zero time is no bound.
	Since, Until time.Time
	// MaxID bounds the selection to ids <= MaxID (0: no bound). Pass the dry run's
	// MaxIDOf so the action covers what it printed, not a dead letter written in between.
	MaxID int64
	// Again also selects dead letters already replayed (a replay again; never for a discard).
	Again bool
}

// Summary is one line of a bulk action's dry run: the selected dead letters of one
// (group, topic, error class).
type Summary struct {
	Group      string    `json:"group"`
	Topic      string    `json:"topic"`
	ErrorClass string    `json:"error_class"`
	Count      int64     `json:"count"`
	FirstID    int64     `json:"first_id"`
	LastID     int64     `json:"last_id"`
	Oldest     time.Time `json:"oldest_failure"`
	Newest     time.Time `json:"newest_failure"`
}

// MaxIDOf returns the highest LastID of a summary (0 when empty).
func MaxIDOf(s []Summary) int64 {
	var m int64
	for _, x := range s {
		m = max(m, x.LastID)
	}
	return m
}

// ErrNoReason is returned by the bulk actions without a reason: every operator action is
// audited with why.
var ErrNoReason = errors.New("dlq: a reason is required (recorded in dlq_audit)")

// bulkBatch is how many dead letters ReplayAllTx reads and writes to the outbox per round
// trip (their values are held in memory meanwhile).
const bulkBatch = 1000

const selectionWhere = `(status = 'new' OR ($1 AND status = 'replayed')) AND ($2 = '' OR group_id = $2) AND ($3 = '' OR topic = $3)
	AND ($4 = '' OR error_class = $4) AND ($5::timestamptz IS NULL OR last_failure_at >= $5)
	AND ($6::timestamptz IS NULL OR last_failure_at < $6) AND ($7::bigint = 0 OR id <= $7::bigint)`

func (s Selection) args() []any {
	var since, until *time.Time
	if !s.Since.IsZero() {
		since = &s.Since
	}
	if !s.Until.IsZero() {
		until = &s.Until
	}
	return []any{s.Again, s.Group, s.Topic, s.ErrorClass, since, until, s.MaxID}
}

// Summarize is the dry run of a bulk action: the dead letters sel selects, per (group,
// topic, error class), in that order. It changes nothing.
func Summarize(ctx context.Context, q pg.Querier, schema string, sel Selection) ([]Summary, error) {
	rows, err := q.Query(ctx, `SELECT group_id, topic, error_class, count(*), min(id), max(id), min(last_failure_at), max(last_failure_at)
		FROM `+tables.For(schema).DeadLetters+` WHERE `+selectionWhere+`
		GROUP BY group_id, topic, error_class ORDER BY group_id, topic, error_class`, sel.args()...)
	if err != nil {
		return nil, fmt.Errorf("dlq: summarize dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Summary, error) {
		var s Summary
		err := r.Scan(&s.Group, &s.Topic, &s.ErrorClass, &s.Count, &s.FirstID, &s.LastID, &s.Oldest, &s.Newest)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("dlq: summarize dead letters: %w", err)
	}
	return out, nil
}

// ReplayAllTx re-publishes every dead letter sel selects through the outbox, in the caller's
// transaction (which it never commits), as ReplayTx does for one: per dead letter one outbox
// row (original key, value and headers; to r.ToTopic or its own topic), status replayed and
// a dlq_audit row naming the outbox row. sel.Again is taken from r.Again. It works in
// batches of 1,000 (two statements each, lowest id first) and returns how many it replayed;
// none selected is not an error. An empty r.Reason is refused with ErrNoReason, an r.ToTopic
// Kafka refuses as a topic name as ReplayTx refuses it.
func ReplayAllTx(ctx context.Context, tx pgx.Tx, schema string, sel Selection, r Replay) (int64, error) {
	if r.Reason == "" {
		return 0, ErrNoReason
	}
	if err := r.checkToTopic(); err != nil {
		return 0, err
	}
	schema = pg.SchemaOr(schema)
	sel.Again = r.Again
	t := tables.For(schema)
	audit := t.DLQAudit
	var done, after int64
	for {
		rows, err := tx.Query(ctx, `SELECT `+columns+` FROM `+t.DeadLetters+` WHERE `+selectionWhere+` AND id > $8
			ORDER BY id LIMIT $9 FOR UPDATE`, append(sel.args(), after, bulkBatch)...)
		if err != nil {
			return done, fmt.Errorf("dlq: select dead letters to replay: %w", err)
		}
		ds, err := pgx.CollectRows(rows, scanDeadLetter)
		if err != nil {
			return done, fmt.Errorf("dlq: select dead letters to replay: %w", err)
		}
		if len(ds) == 0 {
			return done, nil
		}
		recs := make([]outbox.Record, len(ds))
		dlIDs := make([]int64, len(ds))
		topics := make([]string, len(ds))
		for i := range ds {
			recs[i] = replayRecord(&ds[i], r.ToTopic)
			dlIDs[i], topics[i] = ds[i].ID, recs[i].Topic
		}
		obIDs, err := outbox.Writer{Schema: schema}.WriteTx(ctx, tx, recs...)
		if err != nil {
			return done, fmt.Errorf("dlq: replay %d dead letters: %w", len(ds), err)
		}
		var n int64
		err = tx.QueryRow(ctx, `WITH x AS (SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[]) AS x(dl, ob, topic)),
			u AS (UPDATE `+t.DeadLetters+` d SET status = 'replayed', resolved_at = now() FROM x WHERE d.id = x.dl RETURNING d.id),
			a AS (INSERT INTO `+audit+` (dead_letter_id, action, to_topic, outbox_row, reason, actor)
				SELECT x.dl, 'replay', x.topic, x.ob, $4, $5 FROM x JOIN u ON u.id = x.dl ORDER BY x.dl RETURNING 1)
			SELECT count(*) FROM a`,
			dlIDs, obIDs, topics, pg.SanitizeText(r.Reason, 1024), pg.SanitizeText(r.Actor, 256)).Scan(&n)
		if err != nil {
			return done, fmt.Errorf("dlq: mark %d dead letters replayed: %w", len(ds), err)
		}
		if n != int64(len(ds)) {
			return done, fmt.Errorf("dlq: marked %d of %d dead letters replayed", n, len(ds))
		}
		done += n
		after = dlIDs[len(dlIDs)-1]
	}
}

// DiscardAllTx marks every new dead letter sel selects discarded, with one dlq_audit row
// each, in one statement in the caller's transaction, and returns how many. sel.Again is
// ignored (a replayed dead letter is never discarded). An empty a.Reason is refused.
func DiscardAllTx(ctx context.Context, tx pgx.Tx, schema string, sel Selection, a Action) (int64, error) {
	if a.Reason == "" {
		return 0, ErrNoReason
	}
	schema = pg.SchemaOr(schema)
	sel.Again = false
	var n int64
	err := tx.QueryRow(ctx, `WITH sel AS (SELECT id FROM `+tables.For(schema).DeadLetters+` WHERE `+selectionWhere+` ORDER BY id FOR UPDATE),
		u AS (UPDATE `+tables.For(schema).DeadLetters+` d SET status = 'discarded', resolved_at = now() FROM sel WHERE d.id = sel.id RETURNING d.id),
		a AS (INSERT INTO `+tables.For(schema).DLQAudit+` (dead_letter_id, action, reason, actor)
			SELECT id, 'discard', $8, $9 FROM u ORDER BY id RETURNING 1)
		SELECT count(*) FROM a`, append(sel.args(), pg.SanitizeText(a.Reason, 1024), pg.SanitizeText(a.Actor, 256))...).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("dlq: discard dead letters: %w", err)
	}
	return n, nil
}
