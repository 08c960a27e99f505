package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
)

// hostile is text a Kafka message or a handler's error can put in kafkatx's tables: an ANSI
// colour, a line of its own that forges a row of the output, a carriage return, a C1 control
// and a bidi override.
const hostile = "atk\x1b[31mRED\nFAKE  topic=x parked=2020\rCR\u009b\u202eevil\u2066"

// rawControl names the first byte or rune of out a terminal would obey, other than the
// newlines between lines: a C0 or C1 control, DEL, a bidi override or isolate, invalid UTF-8.
func rawControl(out string) string {
	for i, r := range out {
		switch {
		case r == utf8.RuneError:
			if _, n := utf8.DecodeRuneInString(out[i:]); n == 1 {
				return "invalid UTF-8"
			}
		case r == '\n':
		case r < 0x20 || r == 0x7f || r >= 0x80 && r <= 0x9f || r >= 0x202a && r <= 0x202e || r >= 0x2066 && r <= 0x2069:
			return fmt.Sprintf("U+%04X", r)
		}
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "FAKE") {
			return "a forged line"
		}
	}
	return ""
}

// Issue 48, F4: every text output of the command writes text read from the database (a topic,
// a consumer group, an error class or message, a stack, a header key, an audit actor or
// reason) escaped, as it writes keys and values: none of hostile's controls reaches the
// terminal raw and no line of the output is forged. Before, `outbox parked`, the plan of
// `outbox release --all` and `dlq show` printed them as they were.
func TestTextOutputsEscapeDatabaseText(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	if _, err := migrations.Apply(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	tb := tables.For(schema)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		ids, err := outbox.Writer{Schema: schema}.WriteTx(ctx, tx, outbox.Record{Topic: hostile, Key: []byte("k"), Value: []byte("v")})
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE `+tb.Outbox+` SET state = 'parked', parked_at = now(), last_error = $2 WHERE id = ANY($1)`, ids, hostile); err != nil {
			return err
		}
		var dl int64
		if err := tx.QueryRow(ctx, `INSERT INTO `+tb.DeadLetters+`
			(group_id, topic, partition, "offset", header_keys, header_values, error_class, error_message, stack, attempts, first_failure_at, last_failure_at, topic_id, cluster_id)
			VALUES ($1, $1, 0, 7, ARRAY[$2::bytea], ARRAY['v'::bytea], $1, $1, $1 || E'\n\tmain.go:12', 1, now(), now(), $1, $1) RETURNING id`,
			hostile, []byte(hostile+"\xff")).Scan(&dl); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+tb.DLQAudit+` (dead_letter_id, action, to_topic, outbox_row, reason, actor) VALUES ($1, 'replay', $2, 1, $2, $2)`, dl, hostile); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+tb.Watermarks+` (group_id, topic, partition, next_offset, first_offset) VALUES ('g', $1, 0, 10, 0)`, hostile); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+tb.OffsetAudit+` (group_id, topic, partition, kind, from_offset, to_offset, reason, actor) VALUES ('g', $1, 0, 'operator_skip', 0, 10, $1, $1)`, hostile)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	cli := buildCLI(t)
	for _, args := range [][]string{
		{"outbox", "parked"},
		{"outbox", "release", "--all", "--dry-run", "--reason", "x"},
		{"outbox", "discard", "--all", "--dry-run", "--reason", "x"},
		{"dlq", "list", "--status", "all"},
		{"dlq", "show", "1"},
		{"dlq", "discard", "--all", "--dry-run", "--reason", "x"},
		{"dlq", "replay", "--all", "--again", "--dry-run", "--reason", "x"},
		{"offsets", "audit", "--group", "g"},
		{"offsets", "account", "--group", "g"},
	} {
		out, errOut, code := runCLI(t, cli, append([]string{"--schema", schema, "--database-url", testenv.DatabaseURL(t)}, args...)...)
		if code != 0 && args[1] != "account" {
			t.Errorf("%s: exit %d, stderr %q", strings.Join(args, " "), code, errOut)
		}
		if !strings.Contains(out, `atk\x1b[31mRED\nFAKE`) && !strings.Contains(out, `atk\x1b[31mRED\\nFAKE`) {
			t.Errorf("%s: the hostile text is not in the output, escaped:\n%s", strings.Join(args, " "), out)
		}
		for name, s := range map[string]string{"stdout": out, "stderr": errOut} {
			if what := rawControl(s); what != "" {
				t.Errorf("%s: %s holds %s raw:\n%q", strings.Join(args, " "), name, what, s)
			}
		}
	}
}
