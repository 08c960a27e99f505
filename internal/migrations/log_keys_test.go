package migrations_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

// The migration that keys dead letters by their log places the rows written before it: in
// the log their watermark names, unless that log was adopted after their last failure (an
// older log: ” for unknown). Afterwards a dead letter of the same offset in another log is
// a row of its own.
func TestDeadLettersFromBeforeTheLogKeyArePlaced(t *testing.T) {
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	ctx := context.Background()
	var keys migrations.Migration
	for _, m := range migrations.All() {
		if m.Name == "log_identity_keys" {
			keys = m
			break
		}
		if _, err := pool.Exec(ctx, m.SQL(schema)); err != nil {
			t.Fatalf("migration %d: %v", m.Version, err)
		}
	}
	if keys.Name == "" {
		t.Fatal("no log_identity_keys migration")
	}
	s := pgx.Identifier{schema}.Sanitize()
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, strings.ReplaceAll(sql, "{{s}}", s), args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`INSERT INTO {{s}}.watermarks (group_id, topic, partition, next_offset, first_offset, topic_id, cluster_id) VALUES
		('g', 'same', 0, 5, 0, 'T1', 'C1'), ('g', 'adopted', 0, 5, 0, 'T2new', 'C1')`)
	dl := `INSERT INTO {{s}}.dead_letters (group_id, topic, partition, "offset", error_class, error_message, attempts, first_failure_at, last_failure_at)
		VALUES ('g', $1, 0, 3, 'permanent', 'x', 1, $2::timestamptz, $2::timestamptz)`
	exec(dl, "same", "2026-01-01T00:00:00Z")
	exec(dl, "adopted", "2026-01-01T00:00:00Z") // failed in the old log, before the adoption below
	exec(`INSERT INTO {{s}}.offset_audit (group_id, topic, partition, kind, from_offset, to_offset, at)
		VALUES ('g', 'adopted', 0, 'log_adopted', 9, 0, '2026-02-01T00:00:00Z')`)
	if _, err := pool.Exec(ctx, keys.SQL(schema)); err != nil {
		t.Fatal(err)
	}
	for topic, want := range map[string]string{"same": "T1/C1", "adopted": "/"} {
		var got string
		if err := pool.QueryRow(ctx, `SELECT topic_id || '/' || cluster_id FROM `+s+`.dead_letters WHERE topic = $1`, topic).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("dead letter of %s placed in log %q, want %q", topic, got, want)
		}
	}
	// The same offset in another log is another row; in the same log, a conflict.
	exec(`INSERT INTO {{s}}.dead_letters (group_id, topic, partition, "offset", error_class, error_message, attempts, first_failure_at, last_failure_at, topic_id, cluster_id)
		VALUES ('g', 'adopted', 0, 3, 'permanent', 'y', 1, now(), now(), 'T2new', 'C1')`)
	if _, err := pool.Exec(ctx, `INSERT INTO `+s+`.dead_letters (group_id, topic, partition, "offset", error_class, error_message, attempts, first_failure_at, last_failure_at, topic_id, cluster_id)
		VALUES ('g', 'same', 0, 3, 'permanent', 'y', 1, now(), now(), 'T1', 'C1')`); err == nil || !strings.Contains(err.Error(), "dead_letters_log_offset_key") {
		t.Fatalf("a second dead letter of one offset in one log: %v, want a unique violation of dead_letters_log_offset_key", err)
	}
}
