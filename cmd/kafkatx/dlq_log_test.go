package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/dlq"
	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

// Issue "Kafka's side of the history": a dead letter is written in the log its watermark
// names (dlq.InsertTx reads the ids in the same statement), so one offset of two logs (the
// topic recreated, the new log adopted) is two dead letters, and `dlq list` / `dlq show` say
// which log each came from.
func TestDLQListAndShowNameTheLogOfEachDeadLetter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	if _, err := migrations.Apply(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	tb := tables.For(schema)
	if _, err := pool.Exec(ctx, `INSERT INTO `+tb.Watermarks+` (group_id, topic, partition, next_offset, first_offset, topic_id, cluster_id)
		VALUES ('g', 'orders', 0, 8, 0, 'OldTopicId', 'Cluster1')`); err != nil {
		t.Fatal(err)
	}
	write := func(value string) *dlq.DeadLetter {
		t.Helper()
		d := &dlq.DeadLetter{Group: "g", Topic: "orders", Offset: 7, Value: []byte(value), ErrorClass: "permanent", ErrorMessage: "bad " + value,
			Attempts: 1, FirstFailureAt: time.Now(), LastFailureAt: time.Now()}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			d.ID, _, err = dlq.InsertTx(ctx, tx, schema, d)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return d
	}
	old := write("old-log")
	if old.TopicID != "OldTopicId" || old.ClusterID != "Cluster1" {
		t.Fatalf("dead letter written in log %q/%q, want the watermark's OldTopicId/Cluster1", old.TopicID, old.ClusterID)
	}
	if _, err := pool.Exec(ctx, `UPDATE `+tb.Watermarks+` SET topic_id = 'NewTopicId', next_offset = 8`); err != nil { // as an adoption leaves it
		t.Fatal(err)
	}
	fresh := write("new-log")
	if fresh.ID == old.ID || fresh.TopicID != "NewTopicId" {
		t.Fatalf("the new log's dead letter at the same offset: id %d (old %d), log %q; want a row of its own in NewTopicId", fresh.ID, old.ID, fresh.TopicID)
	}
	cli := buildCLI(t)
	run := func(args ...string) string {
		t.Helper()
		out, errOut, code := runCLI(t, cli, append([]string{"--schema", schema, "--database-url", testenv.DatabaseURL(t)}, args...)...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errOut)
		}
		return out
	}
	out := run("dlq", "list")
	if !strings.Contains(out, "orders[0]@7  topic_id=OldTopicId") || !strings.Contains(out, "orders[0]@7  topic_id=NewTopicId") {
		t.Fatalf("dlq list does not name the log of each dead letter at offset 7:\n%s", out)
	}
	if out := run("dlq", "list", "--output", "json"); !strings.Contains(out, `"topic_id":"OldTopicId","cluster_id":"Cluster1"`) || !strings.Contains(out, `"topic_id":"NewTopicId"`) {
		t.Fatalf("dlq list --output json does not name the logs:\n%s", out)
	}
	if out := run("dlq", "show", fmt.Sprint(old.ID)); !strings.Contains(out, "log:       topic id OldTopicId, cluster id Cluster1") {
		t.Fatalf("dlq show does not name the log:\n%s", out)
	}
}
