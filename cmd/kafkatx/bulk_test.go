package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/dlq"
	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
)

// Issue "a user's first week" 3 and 4: `outbox release --all [--topic T]` and `dlq
// replay|discard --all` with filters print their plan, change nothing on --dry-run, then act
// on exactly the planned rows with one audit row each; a second replay of one dead letter
// says how to replay it again.
func TestBulkOperatorCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	if _, err := migrations.Apply(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	tb := tables.For(schema)
	q := func(sql string, args ...any) int64 {
		t.Helper()
		var n int64
		if err := pool.QueryRow(ctx, strings.ReplaceAll(sql, "{{schema}}", pgx.Identifier{schema}.Sanitize()), args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	park := func(topic string, n int) {
		t.Helper()
		recs := make([]outbox.Record, n)
		for i := range recs {
			recs[i] = outbox.Record{Topic: topic, Key: fmt.Appendf(nil, "k%d", i), Value: []byte("v")}
		}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			ids, err := outbox.Writer{Schema: schema}.WriteTx(ctx, tx, recs...)
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, `UPDATE `+tb.Outbox+` SET state = 'parked', parked_at = now(), last_error = 'too large' WHERE id = ANY($1)`, ids)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	park("big-events", 3000)
	park("other", 4)
	cli := buildCLI(t)
	run := func(args ...string) (string, string, int) {
		t.Helper()
		return runCLI(t, cli, append([]string{"--schema", schema, "--database-url", testenv.DatabaseURL(t)}, args...)...)
	}

	help, _, _ := run("outbox", "release", "--help")
	if !strings.Contains(help, "--all") || !strings.Contains(help, "--dry-run") {
		t.Fatalf("outbox release --help names no --all or --dry-run:\n%s", help)
	}
	for _, args := range [][]string{
		{"outbox", "release", "--reason", "x"},
		{"outbox", "release", "7", "--all", "--reason", "x"},
		{"outbox", "release", "7", "--topic", "t", "--reason", "x"},
		{"outbox", "discard", "--all", "--reason", " "},
		{"dlq", "replay", "--all", "--since", "-5m", "--reason", "x"},
		{"dlq", "discard", "--all", "--since", "yesterday", "--reason", "x"},
		{"dlq", "replay", "3", "--error-class", "panic", "--reason", "x"},
	} {
		out, errOut, code := run(args...)
		if code != 2 || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || out != "" {
			t.Fatalf("kafkatx %q: exit %d, want 2 and one line\nstdout %q\nstderr %q", args, code, out, errOut)
		}
	}
	if q(`SELECT count(*) FROM `+tb.Outbox+` WHERE state = 'parked'`) != 3004 {
		t.Fatal("a refused command changed rows")
	}

	out, _, code := run("outbox", "release", "--all", "--topic", "big-events", "--reason", "limit raised", "--dry-run")
	if code != 0 || !strings.Contains(out, "big-events: 3000 row(s)") || !strings.Contains(out, "dry run: nothing changed") {
		t.Fatalf("dry run: exit %d\n%s", code, out)
	}
	if n := q(`SELECT count(*) FROM ` + tb.Outbox + ` WHERE state = 'parked'`); n != 3004 {
		t.Fatalf("the dry run released rows: %d parked", n)
	}
	start := time.Now()
	out, _, code = run("outbox", "release", "--all", "--topic", "big-events", "--reason", "limit raised")
	t.Logf("outbox release --all of 3000 rows: %v (process included)\n%s", time.Since(start), out)
	if code != 0 || !strings.Contains(out, "plan: release 3000") || !strings.Contains(out, "released 3000 parked outbox row(s)") {
		t.Fatalf("release --all: exit %d\n%s", code, out)
	}
	if n := q(`SELECT count(*) FROM {{schema}}.outbox_audit WHERE action = 'release' AND reason = 'limit raised' AND actor <> ''`); n != 3000 {
		t.Fatalf("%d audit rows, want 3000", n)
	}
	if n := q(`SELECT count(*) FROM ` + tb.Outbox + ` WHERE state = 'parked' AND topic = 'other'`); n != 4 {
		t.Fatalf("--topic released other topics' rows: %d of 4 left", n)
	}
	if out, _, code = run("outbox", "discard", "--all", "--topic", "big-events", "--reason", "x"); code != 0 || !strings.Contains(out, "nothing to discard") {
		t.Fatalf("discard --all with nothing parked: exit %d\n%s", code, out)
	}

	// Dead letters: three of orders (two permanent), one of payments.
	var ids []int64
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for i, x := range []struct{ topic, class string }{{"orders", "permanent"}, {"orders", "permanent"}, {"orders", "max_attempts"}, {"payments", "permanent"}} {
			id, _, err := dlq.InsertTx(ctx, tx, schema, &dlq.DeadLetter{Group: "g", Topic: x.topic, Offset: int64(i), Value: []byte("v"),
				ErrorClass: x.class, ErrorMessage: "bad", Attempts: 1, FirstFailureAt: time.Now(), LastFailureAt: time.Now()})
			if err != nil {
				return err
			}
			ids = append(ids, id)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	out, _, code = run("dlq", "replay", "--all", "--topic", "orders", "--error-class", "permanent", "--since", "1h", "--reason", "fixed")
	if code != 0 || !strings.Contains(out, "group g, topic orders, permanent: 2") || !strings.Contains(out, "replayed 2 dead letter(s)") {
		t.Fatalf("dlq replay --all: exit %d\n%s", code, out)
	}
	if n := q(`SELECT count(*) FROM {{schema}}.dead_letters WHERE status = 'replayed' AND id = ANY($1)`, ids[:2]); n != 2 {
		t.Fatalf("%d of the 2 selected dead letters replayed", n)
	}
	if n := q(`SELECT count(*) FROM {{schema}}.dlq_audit a JOIN ` + tb.Outbox + ` o ON o.id = a.outbox_row WHERE a.action = 'replay' AND o.topic = 'orders'`); n != 2 {
		t.Fatalf("%d audited replays with their outbox row, want 2", n)
	}
	// A second replay of one of them refuses and quotes --again.
	_, errOut, code := run("dlq", "replay", fmt.Sprint(ids[0]), "--reason", "once more")
	if code != exitNotActionable || !strings.Contains(errOut, fmt.Sprintf("kafkatx dlq replay %d --again", ids[0])) {
		t.Fatalf("second replay: exit %d, stderr %q: want %d and the --again command", code, errOut, exitNotActionable)
	}
	out, _, code = run("dlq", "discard", "--all", "--until", "2099-01-01T00:00:00Z", "--reason", "obsolete", "--dry-run")
	if code != 0 || !strings.Contains(out, "discard 2 new dead letter(s)") || q(`SELECT count(*) FROM {{schema}}.dead_letters WHERE status = 'discarded'`) != 0 {
		t.Fatalf("dlq discard --all --dry-run: exit %d\n%s", code, out)
	}
	if out, _, code = run("dlq", "discard", "--all", "--reason", "obsolete"); code != 0 || !strings.Contains(out, "discarded 2 dead letter(s)") {
		t.Fatalf("dlq discard --all: exit %d\n%s", code, out)
	}
}

// Issue "a user's first week" 3, end to end on the real broker: the relay parks 4,950 records
// too large for their topic (4,850 keys of one record and 100 of two: the second of those waits
// behind the first); after the topic's limit is raised one `outbox release --all --topic T`
// puts them back, and the relay publishes every record once, each key in its order.
func TestReleaseAllAfterRaisingTheLimitPublishesEveryParkedRowInKeyOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	if _, err := migrations.Apply(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	brokers := testenv.Brokers(t)
	topic := testenv.TopicWithConfig(t, brokers, 3, map[string]string{"max.message.bytes": "1024"})
	const rows, keys = 5050, 4950
	pad := strings.Repeat("x", 2000)
	recs := make([]outbox.Record, rows)
	for i := range recs {
		recs[i] = outbox.Record{Topic: topic, Key: fmt.Appendf(nil, "k%04d", i%keys), Value: fmt.Appendf(nil, "%05d %s", i, pad)}
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Writer{Schema: schema}.WriteTx(ctx, tx, recs...)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	cli := buildCLI(t)
	run := func(args ...string) (string, string, int) {
		t.Helper()
		return runCLI(t, cli, append([]string{"--schema", schema, "--database-url", testenv.DatabaseURL(t), "--brokers", brokers}, args...)...)
	}
	parked := func() int64 {
		var n int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+tables.For(schema).Outbox+` WHERE state = 'parked'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// The relay refuses them for good: the first of each key is parked, the rest wait behind it.
	if out, errOut, code := run("relay", "--exit-when-idle", "2s"); code != 0 {
		t.Fatalf("relay: exit %d\n%s\n%s", code, out, tailString(errOut, 2000))
	}
	first := parked()
	if first != keys {
		t.Fatalf("the relay parked %d rows, want %d (the first of each key)", first, keys)
	}

	admin, err := kafka.NewAdminClient(&kafka.ConfigMap{"bootstrap.servers": brokers})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	res, err := admin.IncrementalAlterConfigs(ctx, []kafka.ConfigResource{{Type: kafka.ResourceTopic, Name: topic,
		Config: []kafka.ConfigEntry{{Name: "max.message.bytes", Value: "1048588", IncrementalOperation: kafka.AlterConfigOpTypeSet}}}})
	if err != nil || len(res) != 1 || res[0].Error.Code() != kafka.ErrNoError {
		t.Fatalf("raise max.message.bytes: %v %v", err, res)
	}

	// Released and published until nothing is parked or pending (rows behind a parked key are
	// parked in their turn when the relay reaches them).
	start := time.Now()
	var releases int
	for round := 0; parked() > 0 || round == 0; round++ {
		if round == 10 {
			t.Fatalf("%d rows still parked after 10 release rounds", parked())
		}
		out, _, code := run("outbox", "release", "--all", "--topic", topic, "--reason", "max.message.bytes raised")
		if code != 0 {
			t.Fatalf("release --all: exit %d\n%s", code, out)
		}
		releases++
		t.Logf("release --all: %s", strings.TrimSpace(out[strings.LastIndex(strings.TrimSpace(out), "\n")+1:]))
		if out, errOut, code := run("relay", "--exit-when-idle", "2s"); code != 0 {
			t.Fatalf("relay after the release: exit %d\n%s\n%s", code, out, tailString(errOut, 2000))
		}
	}
	t.Logf("%d rows parked at first; %d release --all call(s) and relay runs published them in %v", first, releases, time.Since(start))
	var open int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+tables.For(schema).Outbox+` WHERE state IN ('pending', 'parked')`).Scan(&open); err != nil || open != 0 {
		t.Fatalf("%d rows not published (%v)", open, err)
	}
	last := map[string]int{}
	for _, m := range testenv.Read(t, brokers, topic, rows) {
		var n int
		if _, err := fmt.Sscanf(string(m.Value), "%05d", &n); err != nil {
			t.Fatalf("record %q: %v", m.Value[:10], err)
		}
		k := string(m.Key)
		if prev, ok := last[k]; ok && n <= prev {
			t.Fatalf("key %s: record %d after %d (out of order or twice)", k, n, prev)
		}
		last[k] = n
	}
	if len(last) != keys {
		t.Fatalf("%d keys published, want %d", len(last), keys)
	}
}
