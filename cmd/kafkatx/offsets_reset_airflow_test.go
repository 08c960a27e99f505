package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/idempotency/airflow"
	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/offsets"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

// clearStandIn is an httptest stand-in of what a skip's clear reads and changes in Airflow 3:
// runs (list, get, PATCH state and note), the asset kafkatx_customers (id 5) and its queue
// rows (GET per asset, DELETE per DAG and asset).
type clearStandIn struct {
	mu      sync.Mutex
	runs    map[string]map[string]any // run id -> run of DAG process_customer
	queue   map[string]time.Time      // DAG id -> created_at of its queue row on asset 5
	patches []string
	deletes []string
}

func (s *clearStandIn) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/api/v2/"), "/")
	switch {
	case len(parts) == 2 && parts[0] == "dags":
		_ = json.NewEncoder(w).Encode(map[string]any{"dag_id": parts[1], "is_paused": false, "max_active_runs": 16})
	case r.URL.Path == "/api/v2/assets":
		_, _ = w.Write([]byte(`{"assets":[{"id":5,"name":"kafkatx_customers"}],"total_entries":1}`))
	case len(parts) == 3 && parts[0] == "assets" && parts[1] == "5" && parts[2] == "queuedEvents":
		var out []map[string]any
		for dag, at := range s.queue {
			out = append(out, map[string]any{"asset_id": 5, "dag_id": dag, "created_at": at.UTC().Format(time.RFC3339Nano)})
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"queued_events": out, "total_entries": len(out)})
	case len(parts) == 5 && parts[0] == "dags" && parts[2] == "assets" && r.Method == http.MethodDelete:
		if _, ok := s.queue[parts[1]]; !ok || parts[3] != "5" {
			http.Error(w, `{"detail":"not found"}`, http.StatusNotFound)
			return
		}
		delete(s.queue, parts[1])
		s.deletes = append(s.deletes, parts[1])
		w.WriteHeader(http.StatusNoContent)
	case len(parts) == 3 && parts[0] == "dags" && parts[1] == "process_customer" && parts[2] == "dagRuns":
		var out []map[string]any
		for _, run := range s.runs {
			out = append(out, run)
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"dag_runs": out, "total_entries": len(out)})
	case len(parts) == 4 && parts[0] == "dags" && parts[1] == "process_customer" && parts[2] == "dagRuns":
		run, ok := s.runs[parts[3]]
		if !ok {
			http.Error(w, `{"detail":"no such run"}`, http.StatusNotFound)
			return
		}
		if r.Method == http.MethodPatch {
			var body map[string]string
			_ = json.NewDecoder(r.Body).Decode(&body)
			run["state"], run["note"] = body["state"], body["note"]
			s.patches = append(s.patches, parts[3])
		}
		_ = json.NewEncoder(w).Encode(run)
	default:
		http.Error(w, `{"detail":"not found"}`, http.StatusNotFound)
	}
}

// A skip's neighbourhood read and cleared against the stand-in: the dry run names the queued
// runs and the one touched asset queue row; the clear marks failed only the runs still queued
// (one started meanwhile is left), deletes only the queue row the range's asset events are in
// (a DAG queued after them keeps its row), writes one airflow_clear audit row with the range
// and what was cleared; airflow status then counts the cleared run apart, while a failed run
// with the same note and no audit row covering it stays drift.
func TestSkipClearsQueuedRunsAndTouchedAssetQueues(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	if _, err := migrations.Apply(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	run := func(id, state string) map[string]any {
		at := now.Add(-time.Hour).UTC().Format(time.RFC3339Nano)
		return map[string]any{"dag_id": "process_customer", "dag_run_id": id, "state": state, "queued_at": at, "run_after": at}
	}
	s := &clearStandIn{runs: map[string]map[string]any{"r1": run("r1", "queued"), "r2": run("r2", "success"), "r3": run("r3", "queued"),
		"r9": run("r9", "failed")},
		queue: map[string]time.Time{"process_customer_asset": now.Add(-2 * time.Minute), "later_dag": now.Add(time.Hour)}}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	client, err := airflow.New(airflow.Config{BaseURL: srv.URL, InitialBackoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	tp := offsetstore.TP{Topic: "t", Partition: 1}
	entry := func(off int64, id string, asset bool) airflow.LedgerEntry {
		e := airflow.LedgerEntry{ID: off, Group: "g", Topic: "t", Partition: 1, Offset: off, Key: id, Target: airflow.TargetDAGRun,
			DAGID: "process_customer", RunID: id, Outcome: airflow.OutcomeCreated, CreatedAt: now.Add(-time.Hour)}
		if asset {
			e.Target, e.DAGID, e.RunID, e.AssetName, e.KafkatxID, e.CreatedAt = airflow.TargetAssetEvent, "", "", "kafkatx_customers", id, now.Add(-time.Minute)
		}
		return e
	}
	n := &skipNeighbourhood{tp: tp, from: 0, start: 6, to: 10, auditID: 77,
		entries: []airflow.LedgerEntry{entry(1, "r1", false), entry(2, "r2", false), entry(3, "r3", false), entry(4, "a4", true), entry(5, "a5", true)}}
	if err := readNeighbourhood(ctx, client, n); err != nil {
		t.Fatal(err)
	}
	c := &OffsetsResetCmd{Group: "g", Topic: "t", Mode: "skip", Reason: "bad batch", AirflowBefore: 6}
	var dry bytes.Buffer
	c.printNeighbourhoods(&dry, []*skipNeighbourhood{n})
	for _, want := range []string{"5 rows at offsets [0, 10) (the skipped range [6, 10) and the 6 offsets below it): 3 runs, 2 asset events",
		"runs in Airflow: 2 queued, 1 success", "queued run process_customer/r1 (offset 1): would be marked failed", "queued run process_customer/r3",
		"DAG process_customer_asset waits on its events"} {
		if !strings.Contains(dry.String(), want) {
			t.Errorf("dry run lacks %q:\n%s", want, dry.String())
		}
	}
	if strings.Contains(dry.String(), "later_dag") {
		t.Errorf("dry run names a queue row created after the range's events:\n%s", dry.String())
	}

	s.mu.Lock()
	s.runs["r3"]["state"] = "running" // started between the plan and the clear
	s.mu.Unlock()
	var out bytes.Buffer
	if err := c.clearInAirflow(ctx, client, pool, schema, []*skipNeighbourhood{n}, &out); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	patches, deletes := s.patches, s.deletes
	note, _ := s.runs["r1"]["note"].(string)
	_, laterKept := s.queue["later_dag"]
	s.mu.Unlock()
	if strings.Join(patches, ",") != "r1" || strings.Join(deletes, ",") != "process_customer_asset" || !laterKept {
		t.Errorf("patched %v, deleted the queue rows of %v (later_dag kept: %v); want r1 only and process_customer_asset only\n%s", patches, deletes, laterKept, out.String())
	}
	if !strings.HasPrefix(note, clearNotePrefix) || !strings.Contains(note, "operator_skip audit row 77") || !strings.Contains(note, "bad batch") {
		t.Errorf("note of r1: %q", note)
	}
	if !strings.Contains(out.String(), "run process_customer/r3 is no longer queued (running): left as it is") {
		t.Errorf("the run started meanwhile is not named as left:\n%s", out.String())
	}
	events, err := offsetstore.New(schema).Events(ctx, pool, "g", "t")
	if err != nil || len(events) != 1 {
		t.Fatalf("audit rows: %v %v, want one", events, err)
	}
	if e := events[0]; e.Kind != offsetstore.KindAirflowClear || e.From != 1 || e.To != 6 || !strings.Contains(e.Reason, "1 queued runs marked failed: process_customer/r1") ||
		!strings.Contains(e.Reason, "kafkatx_customers for DAG process_customer_asset") || !strings.HasPrefix(e.Reason, "bad batch") {
		t.Errorf("airflow_clear audit row: %+v", e)
	}

	// airflow status: r1 failed by the clear (covered by the audit row) is cleared; r9 failed
	// with the same note at offset 8 (no audit row covers it) stays drift.
	s.mu.Lock()
	s.runs["r9"]["note"] = note
	s.mu.Unlock()
	rep, err := compareAirflow(ctx, client, []airflow.LedgerEntry{entry(1, "r1", false), entry(2, "r2", false), entry(8, "r9", false)}, time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	if err := clearedBySkip(ctx, pool, schema, "g", rep); err != nil {
		t.Fatal(err)
	}
	if rep.Cleared != 1 || len(rep.Drift) != 1 || rep.Drift[0].RunID != "r9" || rep.Drift[0].Kind != driftFailed {
		t.Errorf("after the clear: %d cleared, drift %+v; want r1 cleared and r9 failed drift", rep.Cleared, rep.Drift)
	}
}

// The Airflow flags of offsets reset and the console: usage errors exit 2 with one line that
// names the flag, and never quote a secret.
func TestAirflowFlagsOfResetAndConsoleUsageErrors(t *testing.T) {
	bin := buildCLI(t)
	pw := t.TempDir() + "/pw"
	if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	reset := []string{"--database-url", "postgres://u@127.0.0.1:1/x", "offsets", "reset", "--group", "g", "--topic", "t", "--to-offset", "5", "--reason", "r"}
	console := []string{"--database-url", "postgres://u@127.0.0.1:1/x", "console", "--token-file", pw}
	for _, c := range []struct {
		args []string
		want string
	}{
		{append(reset, "--mode", "skip", "--clear-airflow"), "--clear-airflow needs --airflow-url"},
		{append(reset, "--mode", "replay", "--clear-airflow", "--airflow-url", "http://h:1"), "--clear-airflow goes with --mode skip"},
		{append(reset, "--mode", "skip", "--airflow-before", "-1"), "--airflow-before -1"},
		{append(reset, "--mode", "skip", "--airflow-username", "admin", "--airflow-password-file", pw), "need --airflow-url"},
		{append(reset, "--mode", "skip", "--airflow-url", "http://u:s3cret@h:1"), "must not carry credentials"},
		{append(reset, "--mode", "skip", "--airflow-url", "http://h:1", "--airflow-username", "admin"), "go together"},
		{append(console, "--airflow-token-file", pw), "need --airflow-url"},
		{append(console, "--airflow-url", "http://h:1", "--airflow-token-file", "/nonexistent/token"), "--airflow-token-file"},
		{append(console, "--airflow-url", "http://h:1", "--airflow-queued-for", "0s"), "--airflow-queued-for"},
	} {
		testenv.RequireUsageError(t, bin, c.args, nil, c.want)
	}
}

// Run again after an interrupted clear, the skip is applied and its plan does nothing: the
// neighbourhood is still the one the first run planned — --airflow-before offsets below the
// range the skip moved the watermark over (its operator_skip audit row), not below the new
// watermark, which would leave the first run's queued runs out (found by a new user: the re-run
// said "nothing to do" and exited 0 with 10 runs still queued).
func TestClearRunAgainAfterAnInterruptedOneKeepsTheFirstNeighbourhood(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	if _, err := migrations.Apply(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	tp := offsetstore.TP{Topic: "t", Partition: 1}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for off := int64(140); off < 163; off++ {
		id := fmt.Sprintf("r%d", off)
		if _, err := airflow.RecordTx(ctx, tx, schema, airflow.LedgerEntry{Group: "g", Topic: "t", Partition: 1, Offset: off, Key: id,
			Target: airflow.TargetDAGRun, DAGID: "process_customer", RunID: id, Outcome: airflow.OutcomeCreated}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	s := pgx.Identifier{schema}.Sanitize()
	if _, err := pool.Exec(ctx, `INSERT INTO `+s+`.offset_audit (group_id, topic, partition, kind, from_offset, to_offset, reason, actor, status)
		VALUES ('g', 't', 1, 'operator_skip', 163, 180, 'bad batch', 'op', 'applied')`); err != nil {
		t.Fatal(err)
	}
	g := &Globals{DatabaseURL: testenv.DatabaseURL(t), Schema: schema}
	c := &OffsetsResetCmd{Group: "g", Topic: "t", Mode: "skip", Reason: "bad batch", AirflowBefore: 10}
	plan := &offsets.Plan{Steps: []offsets.Step{{TP: tp, Watermark: 180, Target: 180, Action: offsets.ActionNone}}}
	ns, err := c.airflowNeighbourhoods(ctx, g, plan)
	if err != nil {
		t.Fatal(err)
	}
	if len(ns) != 1 || ns[0].from != 153 || ns[0].start != 163 || ns[0].to != 180 || len(ns[0].entries) != 10 || ns[0].entries[0].Offset != 153 {
		var got []string
		for _, n := range ns {
			got = append(got, fmt.Sprintf("[%d, %d) start %d, %d rows", n.from, n.to, n.start, len(n.entries)))
		}
		t.Fatalf("neighbourhood of the run again: %v; want [153, 180) from the skip of [163, 180), its 10 rows 153..162", got)
	}
}
