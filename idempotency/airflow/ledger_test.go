package airflow_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/idempotency/airflow"
	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

// The ledger records each event handed to Airflow with its log: a replay of an offset is a
// new row, the log identity comes from the watermark in the same transaction, a rolled-back
// transaction leaves no row, a payload over MaxLedgerPayloadBytes is not kept, and a read
// selects by group, topic, partition and offset range.
func TestLedgerRecordsEachHandOverWithItsLog(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	if _, err := migrations.Apply(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+pgx.Identifier{schema, "watermarks"}.Sanitize()+
		` (group_id, topic, partition, next_offset, first_offset, topic_id, cluster_id, replay_epoch) VALUES ('g', 't', 1, 0, 0, 'TID', 'CID', 2)`); err != nil {
		t.Fatal(err)
	}
	record := func(e airflow.LedgerEntry, commit bool) {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		if _, err := airflow.RecordTx(ctx, tx, schema, e); err != nil {
			t.Fatal(err)
		}
		if commit {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	run := func(p int32, off int64, outcome airflow.Outcome) airflow.LedgerEntry {
		return airflow.LedgerEntry{Group: "g", Topic: "t", Partition: p, Offset: off, Key: "k", Target: airflow.TargetDAGRun,
			DAGID: "d", RunID: "kafkatx__k", Payload: json.RawMessage(`{"id": 1}`), Outcome: outcome}
	}
	record(run(1, 5, airflow.OutcomeCreated), true)
	record(run(1, 5, airflow.OutcomeExisted), true)  // a replay of offset 5
	record(run(1, 6, airflow.OutcomeCreated), false) // rolled back: no row
	record(run(0, 9, airflow.OutcomeCreated), true)
	big := run(1, 7, airflow.OutcomeCreated)
	big.Payload = json.RawMessage(`{"x":"` + strings.Repeat("a", airflow.MaxLedgerPayloadBytes) + `"}`)
	record(big, true)
	record(airflow.LedgerEntry{Group: "g", Topic: "t", Partition: 1, Offset: 8, Key: "k8", Target: airflow.TargetAssetEvent,
		AssetName: "a", KafkatxID: "x8", AssetID: 3, AssetEventID: 44, Outcome: airflow.OutcomeCreated}, true)

	p1 := int32(1)
	from, to := int64(5), int64(8)
	got, err := airflow.ReadLedger(ctx, pool, schema, airflow.LedgerFilter{Group: "g", Topic: "t", Partition: &p1, From: &from, To: &to})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("read %d rows of partition 1 offsets [5, 8), want 3 (offset 5 twice, 7): %+v", len(got), got)
	}
	if got[0].Offset != 5 || got[1].Offset != 5 || got[0].Outcome != airflow.OutcomeCreated || got[1].Outcome != airflow.OutcomeExisted {
		t.Errorf("offset 5's rows: %+v %+v, want created then existed", got[0], got[1])
	}
	if got[0].TopicID != "TID" || got[0].ClusterID != "CID" || got[0].ReplayEpoch != 2 {
		t.Errorf("log of the row: %q %q epoch %d, want the watermark's TID CID 2", got[0].TopicID, got[0].ClusterID, got[0].ReplayEpoch)
	}
	var conf map[string]int
	if err := json.Unmarshal(got[0].Payload, &conf); err != nil || conf["id"] != 1 {
		t.Errorf("payload %s, want the conf {\"id\": 1}", got[0].Payload)
	}
	if got[2].Payload != nil || got[2].PayloadBytes != len(big.Payload) {
		t.Errorf("a payload of %d bytes: kept %d bytes, size %d; want none kept and the size", len(big.Payload), len(got[2].Payload), got[2].PayloadBytes)
	}
	all, err := airflow.ReadLedger(ctx, pool, schema, airflow.LedgerFilter{Group: "g"})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 5 || all[0].Partition != 0 || all[4].Target != airflow.TargetAssetEvent || all[4].AssetEventID != 44 || all[4].KafkatxID != "x8" {
		t.Errorf("whole group: %+v", all)
	}
	if _, err := airflow.RecordTx(ctx, nil, schema, airflow.LedgerEntry{Group: "g", Topic: "t", Key: "k", Target: airflow.TargetDAGRun, Outcome: airflow.OutcomeCreated}); err == nil {
		t.Error("a dag_run entry without DAGID and RunID was accepted")
	}
}

// A pending mark says whether an earlier try may have posted the asset event, and the
// transaction that records the event clears it.
func TestAssetPendingMark(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	if _, err := migrations.Apply(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	since, err := airflow.MarkAssetPending(ctx, pool, schema, "g", "a", "x1")
	if err != nil || !since.IsZero() {
		t.Fatalf("first mark: %v %v, want the zero time (post at once)", since, err)
	}
	again, err := airflow.MarkAssetPending(ctx, pool, schema, "g", "a", "x1")
	if err != nil || again.IsZero() {
		t.Fatalf("second mark: %v %v, want the first mark's time (read back first)", again, err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := airflow.RecordTx(ctx, tx, schema, airflow.LedgerEntry{Group: "g", Topic: "t", Offset: 1, Key: "k", Target: airflow.TargetAssetEvent,
		AssetName: "a", KafkatxID: "x1", Outcome: airflow.OutcomeCreated}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if since, err := airflow.MarkAssetPending(ctx, pool, schema, "g", "a", "x1"); err != nil || !since.IsZero() {
		t.Errorf("mark after the event was recorded: %v %v, want the zero time (the record cleared the mark)", since, err)
	}
}
