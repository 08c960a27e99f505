package dlq

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/pg"
)

// Query selects dead letters for Search: List's Filter plus a partition, an error class, a
// time window on the last failure and a text search. Empty fields match everything.
type Query struct {
	Filter
	// Partition, when not nil, keeps only dead letters of this original partition.
	Partition *int32
	// ErrorClass keeps only dead letters whose error_class is exactly this.
	ErrorClass string
	// Since and Until keep dead letters whose last failure is at or after Since and before
	// Until (zero: unbounded).
	Since, Until time.Time
	// Text keeps dead letters whose error message or stack contains it, case-insensitively
	// (a plain substring: % and _ have no special meaning) and holds each of its words as a
	// word or the start of one: "decod" finds "cannot decode", "ecode" does not (the words go
	// through a full-text index, migration console_search_history).
	Text string
	// Prefix, when > 0, reads only the first Prefix bytes of each key and value (a list
	// bounded in memory whatever the payloads weigh); Found's sizes and SHA-256 sums
	// describe the whole. 0 reads them in full.
	Prefix int
}

// Found is a dead letter as Search returns it: the row and what happened to it since.
type Found struct {
	DeadLetter
	// Replays counts the replay rows of its dlq_audit trail.
	Replays int
	// RefailedAs is the id of a later dead letter of the same group with the same topic, key
	// and value, written after this one's latest replay (the replayed record failed again
	// at its new offset); 0 when none. A dead letter that failed again at its own offset (after
	// an offsets reset --mode replay) is StatusNew again with Replays > 0 instead.
	RefailedAs int64
	// KeySize and ValueSize are the byte lengths of the whole key and value, and KeySHA256
	// and ValueSHA256 their SHA-256 (nil for a nil key or value), whatever Query.Prefix read.
	KeySize, ValueSize     int
	KeySHA256, ValueSHA256 []byte
}

// textIndexExpr is the expression of the full-text index dead_letters_text_idx (migration
// console_search_history); a query must write it exactly so for the index to answer.
const textIndexExpr = `to_tsvector('simple'::regconfig, d.error_message || ' ' || coalesce(d.stack, ''))`

// hasWord reports whether text holds a letter or a digit (a word the full-text index knows).
func hasWord(text string) bool {
	return strings.IndexFunc(text, func(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) }) >= 0
}

// likeEscaper escapes LIKE's special characters (backslash is the default escape).
var likeEscaper = strings.NewReplacer(`\`, `\\`, "%", `\%`, "_", `\_`)

// Search returns the dead letters matching q, lowest id first, at most q.Limit (100 when
// q.Limit <= 0).
func Search(ctx context.Context, qr pg.Querier, schema string, q Query) ([]Found, error) {
	sql, args := searchSQL(schema, q)
	rows, err := qr.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("dlq: search dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Found, error) {
		var f Found
		var replays int64
		d, err := scanDeadLetterExtra(row, &replays, &f.RefailedAs, &f.KeySize, &f.ValueSize, &f.KeySHA256, &f.ValueSHA256)
		f.DeadLetter, f.Replays = d, int(replays)
		return f, err
	})
	if err != nil {
		return nil, fmt.Errorf("dlq: search dead letters: %w", err)
	}
	return out, nil
}

// searchSQL is Search's statement and arguments: keyset paging by id (id > AfterID ORDER
// BY id LIMIT n), each filter a condition an index of the console_search_history migration answers.
func searchSQL(schema string, q Query) (string, []any) {
	schema = pg.SchemaOr(schema)
	if q.Limit <= 0 {
		q.Limit = 100
	}
	t := tables.For(schema)
	audit := t.DLQAudit
	var where []string
	var args []any
	arg := func(v any) string { args = append(args, v); return fmt.Sprintf("$%d", len(args)) }
	where = append(where, "d.id > "+arg(q.AfterID))
	if q.Status != "" {
		where = append(where, "d.status = "+arg(q.Status))
	}
	if q.Group != "" {
		where = append(where, "d.group_id = "+arg(q.Group))
	}
	if q.Topic != "" {
		where = append(where, "d.topic = "+arg(q.Topic))
	}
	if q.Partition != nil {
		where = append(where, "d.partition = "+arg(*q.Partition))
	}
	if q.ErrorClass != "" {
		where = append(where, "d.error_class = "+arg(q.ErrorClass))
	}
	if !q.Since.IsZero() {
		where = append(where, "d.last_failure_at >= "+arg(q.Since))
	}
	if !q.Until.IsZero() {
		where = append(where, "d.last_failure_at < "+arg(q.Until))
	}
	if q.Text != "" {
		// The words of the text, each a word or the start of one, through the full-text index
		// of the console_search_history migration (textIndexExpr); then the text as typed, any case (ILIKE with its
		// own % _ \ escaped).
		if hasWord(q.Text) {
			// The text's own lexemes (PostgreSQL's parser, as the index was built: "needle-12"
			// is needle and -12), each as a prefix: 'needle':* & '-12':*.
			where = append(where, textIndexExpr+` @@ (SELECT to_tsquery('simple'::regconfig, string_agg(quote_literal(lexeme) || ':*', ' & '))
				FROM unnest(to_tsvector('simple'::regconfig, `+arg(q.Text)+`)))`)
		}
		p := arg("%" + likeEscaper.Replace(q.Text) + "%")
		where = append(where, "(d.error_message ILIKE "+p+" OR d.stack ILIKE "+p+")")
	}
	key, value := "d.key", "d.value"
	if q.Prefix > 0 {
		p := arg(q.Prefix)
		key, value = "substring(d.key from 1 for "+p+")", "substring(d.value from 1 for "+p+")"
	}
	sql := `SELECT d.id, d.group_id, d.topic, d.partition, d."offset", ` + key + `, ` + value + `, d.header_keys, d.header_values, d.message_time,
			d.error_class, d.error_message, coalesce(d.stack, ''), d.attempts, d.first_failure_at, d.last_failure_at, d.status, d.created_at,
			d.resolved_at, d.replay_epoch, d.topic_id, d.cluster_id,
			(SELECT count(*) FROM ` + audit + ` a WHERE a.dead_letter_id = d.id AND a.action = 'replay'),
			CASE WHEN r.at IS NULL THEN 0 ELSE coalesce((SELECT min(n.id) FROM ` + t.DeadLetters + ` n
				WHERE n.id > d.id AND n.group_id = d.group_id AND n.topic = coalesce(r.to_topic, d.topic)
					AND n.key IS NOT DISTINCT FROM d.key AND n.value IS NOT DISTINCT FROM d.value AND n.created_at >= r.at), 0) END,
			coalesce(octet_length(d.key), 0), coalesce(octet_length(d.value), 0), sha256(d.key), sha256(d.value)
		FROM ` + t.DeadLetters + ` d
		LEFT JOIN LATERAL (SELECT to_topic, at FROM ` + audit + ` a WHERE a.dead_letter_id = d.id AND a.action = 'replay'
			ORDER BY a.id DESC LIMIT 1) r ON true
		WHERE ` + strings.Join(where, " AND ") + ` ORDER BY d.id LIMIT ` + arg(q.Limit)
	return sql, args
}

// scanDeadLetterExtra scans the columns of scanDeadLetter followed by extra.
func scanDeadLetterExtra(row pgx.CollectableRow, extra ...any) (DeadLetter, error) {
	var d DeadLetter
	var hk, hv [][]byte
	var ts *time.Time
	dest := append([]any{&d.ID, &d.Group, &d.Topic, &d.Partition, &d.Offset, &d.Key, &d.Value, &hk, &hv, &ts,
		&d.ErrorClass, &d.ErrorMessage, &d.Stack, &d.Attempts, &d.FirstFailureAt, &d.LastFailureAt, &d.Status, &d.CreatedAt, &d.ResolvedAt, &d.ReplayEpoch,
		&d.TopicID, &d.ClusterID}, extra...)
	if err := row.Scan(dest...); err != nil {
		return d, err
	}
	if ts != nil {
		d.Timestamp = *ts
	}
	for i := range hk {
		var v []byte
		if i < len(hv) {
			v = hv[i]
		}
		d.Headers = append(d.Headers, Header{Key: string(hk[i]), Value: v})
	}
	return d, nil
}
