package dlq

import (
	"context"
	"github.com/jackc/pgx/v5/pgxpool"
	"strings"
	"testing"
	"time"

	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

// seedDeadLetters inserts n dead letters into schema with generate_series: topics
// "scale.t0".."scale.t9", error classes "permanent"/"max_attempts"/"panic", a last failure one
// minute apart going back from now, messages "cannot decode order N"; every 10,000th message
// says "needle-NNN" instead (a rare text to search for).
func seedDeadLetters(t testing.TB, pool pgxPool, schema string, n int) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `INSERT INTO `+tables.For(schema).DeadLetters+`
		(group_id, topic, partition, "offset", key, value, error_class, error_message, stack, attempts, first_failure_at, last_failure_at)
		SELECT 'scale', 'scale.t' || (i % 10), 0, i, ('k' || i)::bytea, ('{"order":' || i || '}')::bytea,
			CASE WHEN i = $1 THEN 'oversized' ELSE (ARRAY['permanent', 'max_attempts', 'panic'])[1 + i % 3] END,
			CASE WHEN i % 10000 = 0 THEN 'needle-' || i ELSE 'cannot decode order ' || i END, 'goroutine 1 [running]', 5,
			now() - make_interval(mins => $1 - i), now() - make_interval(mins => $1 - i)
		FROM generate_series(1, $1) AS i`, n)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(context.Background(), `ANALYZE `+tables.For(schema).DeadLetters); err != nil {
		t.Fatal(err)
	}
}

// Issue 36: dead-letter search holds at scale — each filter (text, topic, error class, time
// range), with keyset paging by id, is answered by an index, not a walk over every row.
// EXPLAIN on 200,000 dead letters, the plan's root read of dead_letters named for each
// filter; the times are logged, not asserted.
func TestSearchUsesAnIndexForEachFilter(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	ctx := context.Background()
	if _, err := migrations.Apply(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	const n = 200_000
	seedDeadLetters(t, pool, schema, n)
	for _, c := range []struct {
		name  string
		q     Query
		index string // the index the plan must read dead_letters through
	}{
		// Common values (a tenth, a third of the rows): walking the primary key from the page's
		// id is the planner's right choice; a rare one is read through its index.
		{"topic", Query{Filter: Filter{Topic: "scale.t3", AfterID: 150_000, Limit: 100}}, "dead_letters"},
		{"error class", Query{Filter: Filter{AfterID: 150_000, Limit: 100}, ErrorClass: "panic"}, "dead_letters"},
		{"rare error class", Query{Filter: Filter{Limit: 100}, ErrorClass: "oversized"}, "dead_letters_error_class_id_idx"},
		{"time range", Query{Filter: Filter{Limit: 100}, Since: time.Now().Add(-90 * time.Minute), Until: time.Now().Add(-30 * time.Minute)}, "dead_letters_last_failure_idx"},
		{"text", Query{Filter: Filter{Limit: 100}, Text: "NEEDLE-120000"}, "dead_letters_text_idx"},
		{"text, a word's start", Query{Filter: Filter{Limit: 100}, Text: "needle-12000"}, "dead_letters_text_idx"},
	} {
		c.q.Prefix = 32
		sql, args := searchSQL(schema, c.q)
		rows, err := pool.Query(ctx, "EXPLAIN (ANALYZE, FORMAT TEXT) "+sql, args...)
		if err != nil {
			t.Fatal(err)
		}
		var plan []string
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, line)
		}
		rows.Close()
		text := strings.Join(plan, "\n")
		if !strings.Contains(text, "Index Scan using "+c.index) && !strings.Contains(text, "Bitmap Index Scan on "+c.index) || strings.Contains(text, "Seq Scan on dead_letters") {
			t.Errorf("%s: the plan does not read dead_letters through %s:\n%s", c.name, c.index, text)
		}
		start := time.Now()
		found, err := Search(ctx, pool, schema, c.q)
		if err != nil || len(found) == 0 {
			t.Fatalf("%s: %d found, %v", c.name, len(found), err)
		}
		t.Logf("%s over %d dead letters: %d found in %v (%s)", c.name, n, len(found), time.Since(start), plan[len(plan)-1])
	}
}

type pgxPool = *pgxpool.Pool
