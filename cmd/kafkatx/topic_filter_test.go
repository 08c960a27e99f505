package main

import (
	"context"
	"strings"
	"testing"

	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

// Rows written with plain SQL may name a topic Kafka refuses; the relays park them, and
// `outbox release|discard --all` lists them grouped by that topic. --topic, a filter over
// existing rows there, selects them by that text (it was refused as a Kafka topic name,
// exit 2), while a topic to publish to or ask Kafka about keeps Kafka's rule.
func TestTopicFilterSelectsRowsOfAnyTopicText(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	if _, err := migrations.Apply(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	tb := tables.For(schema)
	odd := "atk with space/and§unicode"
	long := "atk-" + strings.Repeat("x", 509)
	for _, tp := range []string{odd, odd, long, "other"} {
		if _, err := pool.Exec(ctx, `INSERT INTO `+tb.Outbox+` (topic, key, value, state, parked_at, last_error)
			VALUES ($1, 'k', 'v', 'parked', now(), 'not a valid Kafka topic name')`, tp); err != nil {
			t.Fatal(err)
		}
	}
	count := func(topic string) int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+tb.Outbox+` WHERE topic = $1 AND state = 'parked'`, topic).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	cli := buildCLI(t)
	run := func(args ...string) (string, string, int) {
		t.Helper()
		return runCLI(t, cli, append([]string{"--schema", schema, "--database-url", testenv.DatabaseURL(t)}, args...)...)
	}
	if out, errOut, code := run("outbox", "release", "--all", "--topic", odd, "--reason", "x", "--dry-run"); code != 0 || !strings.Contains(out, "2 row(s)") {
		t.Fatalf("release --all --topic %q --dry-run: exit %d\n%s%s", odd, code, out, errOut)
	}
	if out, errOut, code := run("outbox", "discard", "--all", "--topic", odd, "--reason", "bad topic"); code != 0 || count(odd) != 0 {
		t.Fatalf("discard --all --topic %q: exit %d, %d rows left\n%s%s", odd, code, count(odd), out, errOut)
	}
	if out, errOut, code := run("outbox", "discard", "--all", "--topic", long, "--reason", "bad topic"); code != 0 || count(long) != 0 || count("other") != 1 {
		t.Fatalf("discard --all --topic <513 bytes>: exit %d, %d rows left, %d of other\n%s%s", code, count(long), count("other"), out, errOut)
	}
	// A filter is bounded; a topic to publish to or to ask Kafka about keeps Kafka's rule.
	for _, args := range [][]string{
		{"outbox", "discard", "--all", "--topic", strings.Repeat("x", 5000), "--reason", "x"},
		{"dlq", "replay", "1", "--to-topic", odd, "--reason", "x"},
		{"offsets", "status", "--group", "g", "--topic", odd},
	} {
		if _, errOut, code := run(args...); code != 2 {
			t.Errorf("%s %s: exit %d, want 2 (usage)\n%s", args[0], args[1], code, errOut)
		}
	}
}
