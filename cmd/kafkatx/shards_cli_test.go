package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/dlq"
	"github.com/kafkatx/kafkatx/idempotency/airflow"
	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/offsets"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/internal/parking"
	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/shards"
)

// twoShards returns the URLs and pools of two shards in schema: s1 is DATABASE_URL (also the
// shard directory's database), s2 a fresh database; both migrated.
func twoShards(t *testing.T) (schema string, urls map[string]string, ps map[string]*pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	p1 := testenv.Postgres(t)
	schema = testenv.Schema(t, p1)
	u2 := testenv.Database(t)
	p2, err := pgxpool.New(ctx, u2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p2.Close)
	for _, p := range []*pgxpool.Pool{p1, p2} {
		if _, err := migrations.Apply(ctx, p, schema); err != nil {
			t.Fatal(err)
		}
	}
	urls = map[string]string{"s1": testenv.DatabaseURL(t), "s2": u2}
	return schema, urls, map[string]*pgxpool.Pool{"s1": p1, "s2": p2}
}

func shardArgs(schema string, urls map[string]string) []string {
	return []string{"--schema", schema, "--database-url", urls["s1"], "--shard", "s1=" + urls["s1"], "--shard", "s2=" + urls["s2"]}
}

// Issue 46: parked-keys list with --shard lists the parked keys of every shard, each naming
// its shard (a "shard" field in JSON, shard=NAME in text), where before it read the
// directory's database alone and missed s2's keys.
func TestParkedKeysListOverShards(t *testing.T) {
	t.Parallel()
	schema, urls, ps := twoShards(t)
	later := time.Now().Add(time.Hour)
	parkForTest(t, ps["s1"], schema, "t", parking.Message{Partition: 0, Offset: 3, Key: []byte("on-s1"), Attempts: 1, NextTry: later})
	parkForTest(t, ps["s2"], schema, "t", parking.Message{Partition: 1, Offset: 7, Key: []byte("on-s2"), Attempts: 1, NextTry: later},
		parking.Message{Partition: 1, Offset: 8, Key: []byte("on-s2")})
	cli := buildCLI(t)
	out, errOut, code := runCLI(t, cli, append(shardArgs(schema, urls), "parked-keys", "list", "--group", "g", "--output", "json")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	got := map[string]parkedKeyJSON{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var j struct {
			Shard string `json:"shard"`
			parkedKeyJSON
		}
		if err := json.Unmarshal([]byte(line), &j); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		if !strings.HasPrefix(line, `{"shard":`) {
			t.Fatalf("%q: the shard is not the first field", line)
		}
		got[j.Shard] = j.parkedKeyJSON
	}
	if len(got) != 2 || got["s1"].Partition != 0 || got["s1"].HeadOffset != 3 || got["s2"].Partition != 1 || got["s2"].Count != 2 {
		t.Fatalf("parked keys by shard: %+v\n%s", got, out)
	}
	out, errOut, code = runCLI(t, cli, append(shardArgs(schema, urls), "parked-keys", "list", "--group", "g")...)
	if code != 0 || !strings.Contains(out, "shard=s1  t[0]: 1 parked keys") || !strings.Contains(out, "shard=s2  t[1]: 1 parked keys, 2 parked messages") {
		t.Fatalf("text: exit %d\n%s%s", code, out, errOut)
	}
	out, _, code = runCLI(t, cli, append(shardArgs(schema, urls), "parked-keys", "list", "--group", "other")...)
	if code != 0 || !strings.Contains(out, "shard s1: no parked keys") || !strings.Contains(out, "shard s2: no parked keys") {
		t.Fatalf("no keys: exit %d\n%s", code, out)
	}
}

// Issue 46: airflow status and repair with --shard read the ledger of every shard: a run
// handed over on s2 and lost by Airflow is drift naming s2 (JSON field, text column), repair
// re-creates it and audits it on s2, not on the directory's database.
func TestAirflowStatusRepairOverShards(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema, urls, ps := twoShards(t)
	s := &standIn{dags: map[string]*standInDAG{}, gets: map[string]int{}}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	now := time.Now()
	s.addRun("process_customer", "r1", "success", now.Add(-time.Minute))
	record := func(shard string, e airflow.LedgerEntry) {
		t.Helper()
		tx, err := ps[shard].Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		if _, err := airflow.RecordTx(ctx, tx, schema, e); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	e1, e2 := runEntry(1, "r1", now), runEntry(2, "r2", now)
	e1.Partition, e2.Partition = 0, 1
	record("s1", e1)
	record("s2", e2)
	cli := buildCLI(t)
	args := append(shardArgs(schema, urls), "--group", "g", "--airflow-url", srv.URL)
	out, errOut, code := runCLI(t, cli, append([]string{"airflow", "status", "--output", "json"}, args...)...)
	var d airflowDrift
	if code != offsetsExitDrift || json.Unmarshal([]byte(strings.TrimSpace(out)), &d) != nil || d.Shard != "s2" || d.Kind != driftMissing || d.RunID != "r2" {
		t.Fatalf("status: exit %d, drift %+v\n%s%s", code, d, out, errOut)
	}
	out, _, code = runCLI(t, cli, append([]string{"airflow", "status"}, args...)...)
	if code != offsetsExitDrift || !strings.HasPrefix(out, "SHARD  KIND") || !strings.Contains(out, "\ns2  ") || !strings.Contains(out, "of 2 ledger entries") {
		t.Fatalf("status text: exit %d\n%s", code, out)
	}
	out, errOut, code = runCLI(t, cli, append([]string{"airflow", "repair", "--reason", "shards test"}, args...)...)
	if code != 0 || !strings.Contains(out, "re-created 1 of 1 missing") || !strings.Contains(out, "shard s2 t[1]@2") {
		t.Fatalf("repair: exit %d\n%s%s", code, out, errOut)
	}
	for shard, want := range map[string]int{"s1": 0, "s2": 1} {
		evs, err := offsetstore.New(schema).Events(ctx, ps[shard], "g", "t")
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, e := range evs {
			if e.Kind == offsetstore.KindAirflowRepair {
				n++
			}
		}
		if n != want {
			t.Fatalf("%s holds %d airflow_repair audit rows, want %d: %+v", shard, n, want, evs)
		}
	}
	if out, _, code := runCLI(t, cli, append([]string{"airflow", "status"}, args...)...); code != 0 || !strings.HasPrefix(out, "aligned: 2 ledger entries") {
		t.Fatalf("after repair: exit %d\n%s", code, out)
	}
}

// Issue 46: offsets reset with --shard acts on the shard that holds the partition, never on
// the directory's database: a reset spanning partitions on two shards is refused (exit 2,
// naming each shard's partitions, nothing changed); --partition 0 (on s2) moves s2's
// watermark and audits there, and writes nothing on s1.
func TestOffsetsResetOverShards(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema, urls, ps := twoShards(t)
	brokers := testenv.Brokers(t)
	topic := testenv.Topic(t, brokers, 2)
	var recs []kafka.Message
	for range 10 {
		recs = append(recs, kafka.Message{Value: []byte("v")}) // all on partition 0
	}
	testenv.Produce(t, brokers, topic, recs)
	st := offsetstore.New(schema)
	for shard, p := range map[string]int32{"s1": 1, "s2": 0} {
		if _, _, err := st.Init(ctx, ps[shard], "g", offsetstore.TP{Topic: topic, Partition: p}, 0); err != nil {
			t.Fatal(err)
		}
	}
	cli := buildCLI(t)
	args := append(shardArgs(schema, urls), "--brokers", brokers, "offsets", "reset", "--group", "g", "--topic", topic, "--to-offset", "3", "--mode", "skip", "--reason", "shards test")
	_, errOut, code := runCLI(t, cli, append(args, "--execute")...)
	if code != exitUsage || !strings.Contains(errOut, "shard s2 holds 0; shard s1 holds 1") {
		t.Fatalf("reset over two shards: exit %d, stderr %q", code, errOut)
	}
	out, errOut, code := runCLI(t, cli, append(args, "--partition", "0", "--execute")...)
	if code != 0 || !strings.Contains(out, "shard s2: the reset acts on its database (partitions 0)") {
		t.Fatalf("reset of partition 0: exit %d\n%s%s", code, out, errOut)
	}
	wm := func(shard string, p int32) (int64, bool) {
		var w int64
		err := ps[shard].QueryRow(ctx, `SELECT next_offset FROM `+tables.For(schema).Watermarks+` WHERE group_id = 'g' AND topic = $1 AND partition = $2`, topic, p).Scan(&w)
		return w, err == nil
	}
	if w, ok := wm("s2", 0); !ok || w != 3 {
		t.Fatalf("s2's watermark of partition 0: %d (%v), want 3", w, ok)
	}
	if w, ok := wm("s1", 0); ok {
		t.Fatalf("s1 got a watermark for partition 0 (%d): the reset acted on the directory's database", w)
	}
	if w, ok := wm("s1", 1); !ok || w != 0 {
		t.Fatalf("s1's watermark of partition 1 moved: %d (%v)", w, ok)
	}
	evs, err := st.Events(ctx, ps["s2"], "g", topic)
	if err != nil || len(evs) == 0 || evs[len(evs)-1].Kind != offsetstore.KindOperatorSkip {
		t.Fatalf("s2's audit: %+v, %v; want an operator_skip row", evs, err)
	}
}

// Issue 46: shards move --cancel. A move whose mover died after copying to s2 (the row
// moving, the watermark on both shards) is cancelled: the row is active on s1 with its epoch
// raised past the move's, s2's copy is gone, shard_move_cancel is audited on both shards. A
// second cancel (no move in progress) and a cancel after the cut-over (the state deleted on
// s1, living on s2) are refused with exit 6, the latter telling the operator to finish the
// move, which then does. --cancel with --to is a usage error.
func TestShardsMoveCancelCLI(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema, urls, ps := twoShards(t)
	tb := tables.For(schema)
	// A real topic: with --brokers (or KAFKA_BOOTSTRAP_SERVERS) shards move checks it.
	topic := testenv.Topic(t, testenv.Brokers(t), 1)
	mark := func(shard string, next int64) {
		t.Helper()
		if _, err := ps[shard].Exec(ctx, `INSERT INTO `+tb.Watermarks+` (group_id, topic, partition, next_offset, first_offset) VALUES ('g', $2, 0, $1, 0)`, next, topic); err != nil {
			t.Fatal(err)
		}
	}
	marks := func() string {
		t.Helper()
		out := ""
		for _, sh := range []string{"s1", "s2"} {
			var n, cancels int64
			if err := ps[sh].QueryRow(ctx, `SELECT (SELECT count(*) FROM `+tb.Watermarks+`), (SELECT count(*) FROM `+tb.OffsetAudit+` WHERE kind = 'shard_move_cancel')`).Scan(&n, &cancels); err != nil {
				t.Fatal(err)
			}
			out += fmt.Sprintf("%s:%d/%d ", sh, n, cancels)
		}
		return out
	}
	mark("s1", 10)
	mark("s2", 10) // the copy a mover committed on s2 before it died
	if _, err := ps["s1"].Exec(ctx, `INSERT INTO `+tb.ShardDirectory+` (group_id, topic, partition, shard, epoch, state, moving_to) VALUES ('g', $1, 0, 's1', 2, 'moving', 's2')`, topic); err != nil {
		t.Fatal(err)
	}
	cli := buildCLI(t)
	args := append(shardArgs(schema, urls), "shards", "move", "--group", "g", "--topic", topic, "--partition", "0")
	if _, errOut, code := runCLI(t, cli, append(args, "--cancel", "--to", "s2", "--reason", "x")...); code != exitUsage || !strings.Contains(errOut, "--cancel takes no --to") {
		t.Fatalf("--cancel --to: exit %d, %s", code, errOut)
	}
	out, errOut, code := runCLI(t, cli, append(args, "--cancel", "--reason", "test: cancel")...)
	if code != 0 || !strings.Contains(out, "stays on shard s1 (epoch 3, active)") {
		t.Fatalf("cancel: exit %d\n%s%s", code, out, errOut)
	}
	if got := marks(); got != "s1:1/1 s2:0/1 " {
		t.Fatalf("after the cancel, watermarks/cancel audit rows: %s; want s1:1/1 s2:0/1", got)
	}
	if _, errOut, code := runCLI(t, cli, append(args, "--cancel", "--reason", "again")...); code != exitNotActionable || !strings.Contains(errOut, "no move in progress") {
		t.Fatalf("a second cancel: exit %d, %s", code, errOut)
	}
	// After a cut-over: the state only on s2, the row still moving.
	if _, err := ps["s1"].Exec(ctx, `DELETE FROM `+tb.Watermarks+`; UPDATE `+tb.ShardDirectory+` SET state = 'moving', moving_to = 's2', epoch = 4`); err != nil {
		t.Fatal(err)
	}
	mark("s2", 10)
	if _, errOut, code := runCLI(t, cli, append(args, "--cancel", "--reason", "late")...); code != exitNotActionable || !strings.Contains(errOut, "passed its cut-over") || !strings.Contains(errOut, "finish it") {
		t.Fatalf("a cancel after the cut-over: exit %d, %s", code, errOut)
	}
	if out, errOut, code := runCLI(t, cli, append(args, "--to", "s2", "--reason", "finish")...); code != 0 || !strings.Contains(out, "on shard s2 (epoch 4, active)") {
		t.Fatalf("finishing the move: exit %d\n%s%s", code, out, errOut)
	}
}

// Issue 46: a shard restored from an older backup holds a watermark for a partition the
// directory maps elsewhere. With partition 0 mapped to s2 (watermark 50, aligned with Kafka)
// and its row copied onto s1 at 20 (what s1 held before the partition moved away), offsets
// status over the shards shows s2's watermark and names s1's copy (stale_copies, exit 3,
// STALE-COPY in text), where before it showed s1's row as the partition's; shards status
// names it too. Before the copy, the same status is aligned (exit 0).
func TestStaleCopyNamedByStatusViews(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema, urls, ps := twoShards(t)
	tb := tables.For(schema)
	brokers := testenv.Brokers(t)
	topic := testenv.Topic(t, brokers, 1)
	group := testenv.Group(t)
	msgs := make([]kafka.Message, 50)
	for i := range msgs {
		msgs[i] = kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: 0}, Value: []byte("v")}
	}
	testenv.Produce(t, brokers, topic, msgs)
	k, err := offsets.NewKafka(kafka.ConfigMap{"bootstrap.servers": brokers}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	if err := k.Commit(ctx, group, map[offsetstore.TP]int64{{Topic: topic, Partition: 0}: 50}); err != nil {
		t.Fatal(err)
	}
	if _, err := ps["s1"].Exec(ctx, `INSERT INTO `+tb.ShardDirectory+` (group_id, topic, partition, shard, epoch) VALUES ($1, $2, 0, 's2', 2)`, group, topic); err != nil {
		t.Fatal(err)
	}
	mark := func(shard string, next int64) {
		t.Helper()
		if _, err := ps[shard].Exec(ctx, `INSERT INTO `+tb.Watermarks+` (group_id, topic, partition, next_offset, first_offset) VALUES ($1, $2, 0, $3, 0)`, group, topic, next); err != nil {
			t.Fatal(err)
		}
	}
	mark("s2", 50)
	cli := buildCLI(t)
	args := append(shardArgs(schema, urls), "--brokers", brokers)
	status := func(wantCode int) offsets.PartitionStatus {
		t.Helper()
		out, errOut, code := runCLI(t, cli, append(args, "offsets", "status", "--group", group, "--output", "json")...)
		var s offsets.PartitionStatus
		if code != wantCode || json.Unmarshal([]byte(strings.TrimSpace(out)), &s) != nil {
			t.Fatalf("offsets status: exit %d (want %d)\n%s%s", code, wantCode, out, errOut)
		}
		return s
	}
	if s := status(0); s.Shard != "s2" || *s.Watermark != 50 || len(s.StaleCopies) != 0 {
		t.Fatalf("before the stale copy: %+v", s)
	}
	mark("s1", 20) // s1 restored from a backup taken before partition 0 left it
	if s := status(3); s.Shard != "s2" || *s.Watermark != 50 || len(s.StaleCopies) != 1 || s.StaleCopies[0] != (offsets.StaleCopy{Shard: "s1", Watermark: 20}) {
		t.Fatalf("with s1's stale copy: shard %q, watermark %v, stale copies %+v; want s2, 50, [{s1 20}]", s.Shard, s.Watermark, s.StaleCopies)
	}
	out, _, code := runCLI(t, cli, append(args, "offsets", "status", "--group", group)...)
	if code != 3 || !strings.Contains(out, "STALE-COPY(shard s1 at 20)") || !strings.Contains(out, "STALE COPY: 1 of 1 partition(s)") {
		t.Fatalf("offsets status text: exit %d\n%s", code, out)
	}
	out, errOut, code := runCLI(t, cli, append(args, "shards", "status", "--group", group, "--output", "json")...)
	var row struct {
		Shard       string              `json:"shard"`
		Watermark   int64               `json:"watermark"`
		StaleCopies []offsets.StaleCopy `json:"stale_copies"`
	}
	if code != 0 || json.Unmarshal([]byte(strings.TrimSpace(out)), &row) != nil || row.Shard != "s2" || row.Watermark != 50 ||
		len(row.StaleCopies) != 1 || row.StaleCopies[0].Shard != "s1" {
		t.Fatalf("shards status: exit %d, %+v\n%s%s", code, row, out, errOut)
	}
	if out, _, _ := runCLI(t, cli, append(args, "shards", "status", "--group", group)...); !strings.Contains(out, "s1 at 20") || !strings.Contains(out, "STALE COPY: 1 watermark row(s)") {
		t.Fatalf("shards status text:\n%s", out)
	}
}

// A fresh-eyes attack: console (before it read shards), outbox parked, relay and dlq
// show|replay|discard took --shard and answered for the directory's database. A command that
// does not read shards refuses the flag with the usage status; the ones that do take it.
func TestShardIsRefusedWhereACommandDoesNotReadShards(t *testing.T) {
	for cmd, refused := range map[string]bool{
		"outbox parked": true, "relay": true, "dlq show <id>": true, "dlq replay [<id>]": true, "dlq discard [<id>]": true,
		"parked-keys release": true, "offsets status": false, "offsets reset": false, "dlq list": false, "shards move": false,
		"migrate up": false, "console": false, "airflow repair": false, "parked-keys list": false,
	} {
		err := checkShardAware(cmd, []string{"s1=postgres://h/db"})
		if (err != nil) != refused {
			t.Errorf("%s with --shard: %v, want refused %v", cmd, err, refused)
		}
		if err != nil && strings.Contains(err.Error(), "postgres://") {
			t.Errorf("%s: the refusal quotes the URL: %v", cmd, err)
		}
		if err := checkShardAware(cmd, nil); err != nil {
			t.Errorf("%s without --shard: %v", cmd, err)
		}
	}
}

// A fresh-eyes attack: a sharded group read without --shard (or with a shard left out)
// reported every partition no_watermark and "aligned" (exit 0), and offsets reset pointed at
// Kafka's own tools. The directory in --database-url's database names the shards: a command
// reading a group's state without all of them is refused with the usage status, naming them.
func TestAShardedGroupReadWithoutItsShardsIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema, urls, ps := twoShards(t)
	brokers := testenv.Brokers(t)
	dir := shards.NewDirectory(ps["s1"], schema)
	for p, to := range map[int32]string{0: "s1", 1: "s2"} {
		if _, _, err := dir.Assign(ctx, "g", "t", p, to); err != nil {
			t.Fatal(err)
		}
	}
	cli := buildCLI(t)
	base := []string{"--schema", schema, "--database-url", urls["s1"], "--brokers", brokers}
	for _, c := range []struct {
		shards []string
		want   string
	}{
		{nil, "maps partitions to shards s1, s2: give each with --shard"},
		{[]string{"--shard", "s1=" + urls["s1"]}, "not given with --shard: s2"},
	} {
		for _, cmd := range [][]string{{"offsets", "status", "--group", "g"}, {"dlq", "list", "--group", "g"}, {"offsets", "account", "--group", "g"}} {
			args := append(append(append([]string{}, base...), c.shards...), cmd...)
			if _, errOut, code := runCLI(t, cli, args...); code != exitUsage || !strings.Contains(errOut, c.want) {
				t.Errorf("%v with %d shards: exit %d, stderr %q; want %d and %q", cmd, len(c.shards)/2, code, errOut, exitUsage, c.want)
			}
		}
	}
	if _, errOut, code := runCLI(t, cli, append(base, "offsets", "reset", "--group", "g", "--topic", "t", "--partition", "1", "--to-offset", "0", "--mode", "skip", "--reason", "x")...); code != exitUsage ||
		!strings.Contains(errOut, "give each with --shard") {
		t.Errorf("offsets reset without --shard: exit %d, stderr %q", code, errOut)
	}
	if _, errOut, code := runCLI(t, cli, append(shardArgs(schema, urls), "--brokers", brokers, "dlq", "list", "--group", "g")...); code != 0 {
		t.Errorf("dlq list with both shards: exit %d, %s", code, errOut)
	}
}

// A fresh-eyes attack: dlq list --limit over two shards printed two next-page lines, "--after
// 26" and "--after 23", neither naming its shard; applied to both, --after 26 skipped s2's
// ids 24 and 25. Each shard's line now names it and pages it alone (--from-shard).
func TestDLQListPagesEachShardOnItsOwn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema, urls, ps := twoShards(t)
	ids := map[string][]int64{}
	for _, sh := range []string{"s1", "s2"} {
		for i := range 4 {
			d := &dlq.DeadLetter{Group: "g", Topic: "orders", Offset: int64(i), Value: []byte("v"), ErrorClass: "permanent", ErrorMessage: "bad",
				Attempts: 1, FirstFailureAt: time.Now(), LastFailureAt: time.Now()}
			if err := pgx.BeginFunc(ctx, ps[sh], func(tx pgx.Tx) error {
				var err error
				d.ID, _, err = dlq.InsertTx(ctx, tx, schema, d)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			ids[sh] = append(ids[sh], d.ID)
		}
	}
	cli := buildCLI(t)
	args := append(shardArgs(schema, urls), "dlq", "list", "--group", "g", "--limit", "2")
	_, errOut, code := runCLI(t, cli, args...)
	want := fmt.Sprintf("the next page of this shard is --from-shard s2 --after %d", ids["s2"][1])
	if code != 0 || !strings.Contains(errOut, want) {
		t.Fatalf("dlq list --limit 2 over shards: exit %d, stderr %q; want %q", code, errOut, want)
	}
	out, errOut, code := runCLI(t, cli, append(args, "--from-shard", "s2", "--after", fmt.Sprint(ids["s2"][1]), "--output", "json")...)
	if code != 0 || strings.Count(out, "\n") != 2 || strings.Contains(out, `"shard":"s1"`) || !strings.Contains(out, fmt.Sprintf(`"id":%d`, ids["s2"][2])) {
		t.Fatalf("the next page of s2: exit %d, stderr %q, out:\n%s", code, errOut, out)
	}
	if _, errOut, code := runCLI(t, cli, append(args, "--from-shard", "s9")...); code != exitUsage || !strings.Contains(errOut, "not one of the shards") {
		t.Fatalf("--from-shard s9: exit %d, %q", code, errOut)
	}
}

// A fresh-eyes attack: shards move and assign took a partition the topic does not have, or a
// topic that does not exist, wrote a directory row and reported success; a move to the shard
// the partition is on said "on shard s1 … in 32ms" as if it had moved it. With --brokers the
// topic and partition are checked first (usage status), and a no-op move says so.
func TestShardsMoveAndAssignCheckThePartitionWithKafka(t *testing.T) {
	t.Parallel()
	schema, urls, _ := twoShards(t)
	brokers := testenv.Brokers(t)
	topic := testenv.Topic(t, brokers, 2)
	cli := buildCLI(t)
	base := append(shardArgs(schema, urls), "--brokers", brokers)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"shards", "move", "--group", "g", "--topic", topic, "--partition", "5", "--to", "s2", "--reason", "x"}, "has partitions 0 to 1"},
		{[]string{"shards", "assign", "--group", "g", "--topic", topic, "--partition", "2", "--to", "s2"}, "has partitions 0 to 1"},
		{[]string{"shards", "move", "--group", "g", "--topic", "no-such-topic-" + schema, "--partition", "0", "--to", "s2", "--reason", "x"}, "does not exist"},
	} {
		if _, errOut, code := runCLI(t, cli, append(base, c.args...)...); code != exitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", c.args, code, errOut, exitUsage, c.want)
		}
	}
	out, errOut, code := runCLI(t, cli, append(shardArgs(schema, urls), "shards", "status", "--output", "json")...)
	if code != 0 || strings.Contains(out, `"partition":5`) || strings.Contains(out, `"partition":2`) {
		t.Fatalf("the refused commands left directory rows: exit %d, %s %s", code, out, errOut)
	}
	if _, errOut, code := runCLI(t, cli, append(base, "shards", "assign", "--group", "g", "--topic", topic, "--partition", "1", "--to", "s1")...); code != 0 {
		t.Fatalf("assign: exit %d, %s", code, errOut)
	}
	out, errOut, code = runCLI(t, cli, append(base, "shards", "move", "--group", "g", "--topic", topic, "--partition", "1", "--to", "s1", "--reason", "x")...)
	if code != 0 || !strings.Contains(out, "already on shard s1") || !strings.Contains(out, "nothing moved") {
		t.Fatalf("a move to the shard it is on: exit %d, out %q, stderr %q", code, out, errOut)
	}
}
