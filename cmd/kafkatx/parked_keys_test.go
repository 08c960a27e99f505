package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/internal/parking"
	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

// parkForTest writes parked messages of group g as the consumer would.
func parkForTest(t *testing.T, pool *pgxpool.Pool, schema, topic string, ms ...parking.Message) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for _, m := range ms {
		m.Group, m.Topic, m.KeyHash, m.Value = "g", topic, parking.KeyHash(m.Key, m.Offset), []byte("v")
		if err := parking.New(schema).ParkTx(ctx, tx, m); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// Issue 45, operators: parked-keys list shows each parked key (key, head offset, count, age,
// last error, next try); release makes the head due now; dead-letter writes the head, or every
// parked message of the key, to the dead-letter table and deletes them in one transaction;
// each action writes an offset_audit row of its own kind; --dry-run changes nothing; a key
// that is not parked exits 6; bad input exits 2 with one line; --all-keys keeps to --rate.
func TestParkedKeysListReleaseDeadLetter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	if _, err := migrations.Apply(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	// A real topic: 12 records on partition 0, the watermark at 10 and still for 10 minutes
	// (lag 2), so that list marks partition 0 blocked by its key with the most parked messages.
	brokers := testenv.Brokers(t)
	topic := testenv.Topic(t, brokers, 2)
	var recs []kafka.Message
	for i := range 12 {
		recs = append(recs, kafka.Message{Value: []byte(fmt.Sprint(i))})
	}
	testenv.Produce(t, brokers, topic, recs)
	if _, _, err := offsetstore.New(schema).Init(ctx, pool, "g", offsetstore.TP{Topic: topic, Partition: 0}, 10); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE `+tables.For(schema).Watermarks+` SET updated_at = now() - interval '10 minutes'`); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Hour)
	parkForTest(t, pool, schema, topic,
		parking.Message{Partition: 0, Offset: 3, Key: []byte("k1"), Attempts: 2, ErrorClass: "handler", LastError: "503 from tenant 7",
			FirstFailureAt: time.Now().Add(-time.Minute), NextTry: later, Headers: []parking.Header{{Key: "h", Value: []byte("x")}}},
		parking.Message{Partition: 0, Offset: 5, Key: []byte("k1")},
		parking.Message{Partition: 0, Offset: 9, Key: []byte("k1")},
		parking.Message{Partition: 0, Offset: 4, Key: []byte("\x1b[31mred"), Attempts: 1, ErrorClass: "handler", LastError: "x", NextTry: later},
		parking.Message{Partition: 1, Offset: 6, Key: []byte("a"), Attempts: 1, NextTry: later},
		parking.Message{Partition: 1, Offset: 7, Key: []byte("b"), Attempts: 1, NextTry: later},
	)
	cli := buildCLI(t)
	run := func(args ...string) (string, string, int) {
		t.Helper()
		return runCLI(t, cli, append([]string{"--schema", schema, "--database-url", testenv.DatabaseURL(t)}, args...)...)
	}
	list := func(args ...string) map[string]parkedKeyJSON {
		t.Helper()
		out, errOut, code := run(append([]string{"parked-keys", "list", "--group", "g", "--output", "json"}, args...)...)
		if code != 0 || errOut != "" {
			t.Fatalf("list: exit %d, stderr %q", code, errOut)
		}
		got := map[string]parkedKeyJSON{}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if line == "" {
				continue
			}
			var j parkedKeyJSON
			if err := json.Unmarshal([]byte(line), &j); err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			got[j.Key.SHA256] = j
		}
		return got
	}
	hashOf := func(k string) string { return hex.EncodeToString(parking.KeyHash([]byte(k), 0)) }
	k1 := hashOf("k1")

	got := list()
	if len(got) != 4 {
		t.Fatalf("%d parked keys listed, want 4: %+v", len(got), got)
	}
	if j := got[k1]; j.HeadOffset != 3 || j.Count != 3 || j.KeyHash != k1 || j.Attempts != 2 || j.LastError != "503 from tenant 7" ||
		j.NextTry == nil || j.Partition != 0 || j.Key.Prefix != `"k1"` {
		t.Fatalf("key k1: %+v", j)
	}
	if j := got[k1]; j.BlockedAt == nil || *j.BlockedAt != 10 {
		t.Fatalf("key k1 is not marked as blocking partition 0 at offset 10: %+v", j)
	}
	for h, j := range got {
		if h != k1 && j.BlockedAt != nil {
			t.Fatalf("key %s marked blocking too: %+v", h, j)
		}
	}
	if got := list("--topic", topic, "--partition", "1"); len(got) != 2 {
		t.Fatalf("--partition 1: %d keys, want 2", len(got))
	}
	out, _, code := run("parked-keys", "list", "--group", "g")
	if code != 0 || !strings.Contains(out, topic+"[0]: 2 parked keys, 4 parked messages") ||
		!strings.Contains(out, "BLOCKED by key_hash "+k1+" at offset 10") || !strings.Contains(out, "last error: handler: 503 from tenant 7") ||
		!strings.Contains(out, "key_hash:   "+k1) || strings.Contains(out, "\x1b") {
		t.Fatalf("text list: exit %d:\n%s", code, out)
	}
	out, errOut, code := run("parked-keys", "list", "--group", "g", "--limit", "1")
	if code != 0 || strings.Count(out, "head ") != 1 || !strings.Contains(errOut, "the first 1 parked keys shown (--limit 1)") {
		t.Fatalf("--limit 1: exit %d, stdout %q, stderr %q", code, out, errOut)
	}

	audit := func(kind string) []offsetstore.Event {
		t.Helper()
		evs, err := offsetstore.New(schema).Events(ctx, pool, "g", topic)
		if err != nil {
			t.Fatal(err)
		}
		var out []offsetstore.Event
		for _, e := range evs {
			if e.Kind == kind {
				out = append(out, e)
			}
		}
		return out
	}

	// Release: a dry run changes nothing; then the head is due now, audited.
	out, _, code = run("parked-keys", "release", "--group", "g", "--topic", topic, "--partition", "0", "--key", "k1", "--reason", "tenant 7 is back", "--dry-run")
	if code != 0 || !strings.Contains(out, "dry run") || list()[k1].NextTry == nil || len(audit(offsetstore.KindParkedKeyReleased)) != 0 {
		t.Fatalf("release --dry-run: exit %d, %q", code, out)
	}
	out, _, code = run("parked-keys", "release", "--group", "g", "--topic", topic, "--partition", "0", "--key", "k1", "--reason", "tenant 7 is back")
	if code != 0 || !strings.Contains(out, "offset 3, is due now") || list()[k1].NextTry != nil {
		t.Fatalf("release: exit %d, %q; %+v", code, out, list()[k1])
	}
	if evs := audit(offsetstore.KindParkedKeyReleased); len(evs) != 1 || evs[0].From != 3 || evs[0].To != 4 ||
		evs[0].Reason != "key_hash "+k1+": tenant 7 is back" || evs[0].Actor == "" {
		t.Fatalf("release audit: %+v", evs)
	}
	_, errOut, code = run("parked-keys", "release", "--group", "g", "--topic", topic, "--partition", "0", "--key", "nope", "--reason", "r")
	if code != exitNotActionable || !strings.Contains(errOut, "not parked") {
		t.Fatalf("release of a key not parked: exit %d, stderr %q", code, errOut)
	}

	deadLetters := func() map[int64]string {
		t.Helper()
		rows, err := pool.Query(ctx, `SELECT "offset", error_class FROM `+tables.For(schema).DeadLetters+` WHERE group_id = 'g' ORDER BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		out := map[int64]string{}
		for rows.Next() {
			var off int64
			var class string
			if err := rows.Scan(&off, &class); err != nil {
				t.Fatal(err)
			}
			out[off] = class
		}
		return out
	}
	// Dead-letter: a dry run changes nothing; the head alone; then --all.
	args := []string{"parked-keys", "dead-letter", "--group", "g", "--topic", topic, "--partition", "0", "--key-hash", k1, "--reason", "give up"}
	out, _, code = run(append(args, "--dry-run")...)
	if code != 0 || !strings.Contains(out, "would dead-letter 1 parked message(s)") || len(deadLetters()) != 0 || list()[k1].Count != 3 {
		t.Fatalf("dead-letter --dry-run: exit %d, %q", code, out)
	}
	out, _, code = run(args...)
	if dl := deadLetters(); code != 0 || len(dl) != 1 || dl[3] != "handler" || list()[k1].HeadOffset != 5 || !strings.Contains(out, "2 parked message(s) of the key remain") {
		t.Fatalf("dead-letter the head: exit %d, %q, dead letters %v, key %+v", code, out, dl, list()[k1])
	}
	out, _, code = run(append(args, "--all")...)
	if dl := deadLetters(); code != 0 || len(dl) != 3 || dl[5] != ClassParkedKeyOperator || dl[9] != ClassParkedKeyOperator {
		t.Fatalf("dead-letter --all: exit %d, %q, dead letters %v", code, out, dl)
	}
	if _, ok := list()[k1]; ok {
		t.Fatal("k1 still parked after dead-letter --all")
	}
	if evs := audit(offsetstore.KindParkedKeyDeadLettered); len(evs) != 2 || evs[0].From != 3 || evs[0].To != 4 || evs[1].From != 5 || evs[1].To != 10 ||
		!strings.HasPrefix(evs[1].Reason, "key_hash "+k1+", offsets 5, 9: give up") {
		t.Fatalf("dead-letter audit: %+v", evs)
	}
	if _, _, code = run(args...); code != exitNotActionable {
		t.Fatalf("dead-letter of a key no longer parked: exit %d, want %d", code, exitNotActionable)
	}

	// --all-keys --dry-run prints the plan and changes nothing.
	out, _, code = run("parked-keys", "release", "--group", "g", "--topic", topic, "--partition", "1", "--all-keys", "--reason", "all back", "--dry-run")
	if code != 0 || !strings.Contains(out, "plan: release 2 parked key(s)") || !strings.Contains(out, "dry run: nothing changed") ||
		len(audit(offsetstore.KindParkedKeyReleased)) != 1 {
		t.Fatalf("release --all-keys --dry-run: exit %d, %q", code, out)
	}
	for _, j := range list("--partition", "1") {
		if j.NextTry == nil {
			t.Fatalf("key %s released by a dry run: %+v", j.KeyHash, j)
		}
	}
	// --all-keys at --rate 2: two keys, the second half a second after the first.
	start := time.Now()
	out, _, code = run("parked-keys", "release", "--group", "g", "--topic", topic, "--partition", "1", "--all-keys", "--rate", "2", "--reason", "all back")
	if code != 0 || !strings.Contains(out, "released 2 parked key(s)") || time.Since(start) < 500*time.Millisecond {
		t.Fatalf("release --all-keys: exit %d after %v, %q", code, time.Since(start), out)
	}
	for _, j := range list("--partition", "1") {
		if j.NextTry != nil {
			t.Fatalf("key %s of partition 1 not released: %+v", j.KeyHash, j)
		}
	}
	if evs := audit(offsetstore.KindParkedKeyReleased); len(evs) != 3 {
		t.Fatalf("%d release audit rows, want 3", len(evs))
	}

	// Bad input: exit 2, one line, before anything is done.
	base := []string{"parked-keys", "release", "--group", "g", "--topic", topic}
	for _, bad := range [][]string{
		append(base, "--partition", "0", "--reason", "r"),
		append(base, "--partition", "0", "--key", "a", "--key-hash", k1, "--reason", "r"),
		append(base, "--partition", "0", "--key-hash", "abc", "--reason", "r"),
		append(base, "--key", "a", "--reason", "r"),
		append(base, "--partition", "0", "--key", "a", "--reason", " "),
		append(base, "--partition", "0", "--all-keys", "--rate", "0", "--reason", "r"),
		append(base, "--partition", "0", "--all-keys", "--rate", "1001", "--reason", "r"),
		append(base, "--partition", "0", "--all-keys", "--key", "a", "--reason", "r"),
		{"parked-keys", "dead-letter", "--group", "g", "--topic", topic, "--partition", "0", "--reason", "r"},
		{"parked-keys", "list", "--group", "g", "--limit", "0"},
		{"parked-keys", "list", "--group", "g", "--partition", "-2"},
		{"parked-keys", "list", "--group", "g", "--output", "yaml"},
	} {
		out, errOut, code := run(bad...)
		if code != exitUsage || out != "" || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || !strings.Contains(errOut, "--help") {
			t.Fatalf("kafkatx %q: exit %d, stdout %q, stderr %q: want 2 and one line", bad, code, out, errOut)
		}
	}
	if evs := audit(offsetstore.KindParkedKeyReleased); len(evs) != 3 {
		t.Fatalf("a refused command wrote an audit row: %d release rows", len(evs))
	}
}
