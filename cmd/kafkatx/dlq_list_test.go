package main

import (
	"context"
	"strings"
	"testing"

	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

// Issue 36: `dlq list --error-class` filters as `dlq replay|discard --all` do, and a list
// cut by --limit says so on stderr with the --after of the next page (stdout stays one
// object a line).
func TestDLQListFiltersByErrorClassAndSaysWhenCut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	if _, err := migrations.Apply(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+tables.For(schema).DeadLetters+`
		(group_id, topic, partition, "offset", error_class, error_message, attempts, first_failure_at, last_failure_at)
		SELECT 'g', 'orders', 0, i, CASE WHEN i % 5 = 0 THEN 'panic' ELSE 'permanent' END, 'failed ' || i, 1, now(), now()
		FROM generate_series(1, 150) AS i`); err != nil {
		t.Fatal(err)
	}
	cli := buildCLI(t)
	run := func(args ...string) (string, string, int) {
		t.Helper()
		return runCLI(t, cli, append([]string{"--schema", schema, "--database-url", testenv.DatabaseURL(t)}, args...)...)
	}
	out, errOut, code := run("dlq", "list", "--error-class", "panic", "--output", "json")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); code != 0 || len(lines) != 30 || strings.Contains(out, `"permanent"`) || errOut != "" {
		t.Fatalf("--error-class panic: exit %d, %d lines, stderr %q", code, len(lines), errOut)
	}
	out, errOut, code = run("dlq", "list", "--output", "json")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); code != 0 || len(lines) != 100 ||
		!strings.Contains(errOut, "the first 100 dead letters shown (--limit 100); more match: the next page is --after 100") {
		t.Fatalf("150 dead letters, default limit: exit %d, %d lines, stderr %q", code, len(lines), errOut)
	}
	out, errOut, code = run("dlq", "list", "--after", "100", "--output", "json")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); code != 0 || len(lines) != 50 || errOut != "" {
		t.Fatalf("the next page: exit %d, %d lines, stderr %q", code, len(lines), errOut)
	}
}
