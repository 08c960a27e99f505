package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// incidentLoadDAG is examples/dags' kafkatx_load: paused when Airflow first parses it, so the
// runs handed to it stay queued — the stale runs of the incident.
const incidentLoadDAG = "kafkatx_load"

// buildCLI builds the kafkatx command of this checkout (module cmd, ../../cmd) into dir.
func buildCLI(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "kafkatx")
	if out, err := exec.Command("go", "-C", "../../cmd", "build", "-o", bin, "./kafkatx").CombinedOutput(); err != nil {
		t.Fatalf("build the kafkatx command: %v\n%s", err, out)
	}
	return bin
}

// kafkatxCLI runs the kafkatx command bin with args and returns its stdout and exit status.
func kafkatxCLI(t *testing.T, bin string, e *env, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"--database-url", e.dbURL, "--brokers", e.brokers}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		if exit.ExitCode() == 5 {
			return stdout.String(), 5 // the group's static member has not timed out yet
		}
		t.Logf("kafkatx %s: exit %d\n%s%s", strings.Join(args[:2], " "), exit.ExitCode(), stdout.String(), stderr.String())
		return stdout.String(), exit.ExitCode()
	case err != nil:
		t.Fatalf("kafkatx %v: %v", args, err)
	}
	return stdout.String(), 0
}

// TestRealAirflowSeedIncidentInLockstep is the seed's incident against the real Airflow 3.3.2,
// every step through the commands an operator runs: CDC-shaped events produced by the test
// on one partition; dagtrigger --asset kafkatx_customers turns 8 of them into asset events and
// dead-letters a poison pill once; dagtrigger --dag-id kafkatx_load hands 4 more to a paused
// DAG, where they stay queued (the stale runs); 4 bad events follow. The operator's
// `kafkatx offsets reset --mode skip` dry run names the ledger rows below the skip (and how to
// clear them); with Airflow access it names the 4 queued runs; with --clear-airflow --execute
// it skips [13, 17), marks the 4 runs failed with a note and writes an airflow_clear audit
// row. dagtrigger --asset takes the 3 events after the skip. At the end `kafkatx airflow
// status` is aligned (exit 0, the 4 runs counted as cleared), and every event is accounted
// for once: each offset in the ledger once, dead-lettered once or in the audited skip, and
// each asset event once in Airflow.
func TestRealAirflowSeedIncidentInLockstep(t *testing.T) {
	t.Parallel()
	started := time.Now()
	af := needAirflow(t)
	var dag struct {
		Paused bool `json:"is_paused"`
	}
	if _, err := af.do(http.MethodGet, "/api/v2/dags/"+incidentLoadDAG, nil, &dag); err != nil {
		t.Fatalf("Airflow has no DAG %s (examples/dags not parsed): %v", incidentLoadDAG, err)
	}
	if !dag.Paused { // its runs must stay queued; restore what we found
		if _, err := af.do(http.MethodPatch, "/api/v2/dags/"+incidentLoadDAG, map[string]bool{"is_paused": true}, nil); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_, _ = af.do(http.MethodPatch, "/api/v2/dags/"+incidentLoadDAG, map[string]bool{"is_paused": false}, nil)
		})
	}
	brokers := testenv.Brokers(t)
	e := &env{bin: buildBinary(t), brokers: brokers, dbURL: testenv.Database(t), topic: testenv.Topic(t, brokers, 1),
		group: testenv.Group(t), airflowURL: af.url, logDir: t.TempDir()}
	cli := buildCLI(t, t.TempDir())
	auth := []string{"--airflow-url", af.url, "--airflow-username", af.username, "--airflow-password-file", af.passwordFile}

	// Events of this run only: new source positions, so new run ids and kafkatx_ids.
	base := rand.Int64N(1 << 40)
	cdc := func(from, to int) [][2][]byte {
		var kvs [][2][]byte
		for i := from; i <= to; i++ {
			kvs = append(kvs, [2][]byte{fmt.Appendf(nil, `{"id":%d}`, i), fmt.Appendf(nil,
				`{"before":null,"after":{"id":%d,"status":"active"},"source":{"connector":"postgresql","db":"app","schema":"public","table":"customers","lsn":%d,"txId":%d},"op":"u","ts_ms":1790000000000}`,
				i, base*64+int64(i)*64, base+int64(i))})
		}
		return kvs
	}
	asset := []string{"--asset", "kafkatx_customers", "--airflow-username", af.username, "--airflow-password-file", af.passwordFile}
	// Offsets 0-5 and 7-8: changes; 6: a poison pill.
	kvs := append(cdc(0, 5), [2][]byte{[]byte(`{"id":6}`), []byte("not a change event \x00\xff")})
	produceRaw(t, e.brokers, e.topic, append(kvs, cdc(7, 8)...))
	if sum := e.finish(t, 0, asset...); sum["dead_lettered"] != 1 {
		t.Fatalf("first asset pass: summary %v, want the poison pill dead-lettered once", sum)
	}
	// Offsets 9-12: runs of the paused kafkatx_load, queued for good.
	produceRaw(t, e.brokers, e.topic, cdc(9, 12))
	if sum := e.finish(t, 1, "--dag-id", incidentLoadDAG, "--airflow-username", af.username, "--airflow-password-file", af.passwordFile); sum["runs_created"] != 4 {
		t.Fatalf("kafkatx_load pass: summary %v, want 4 runs created", sum)
	}
	// Offsets 13-16: the bad batch the operator skips; 17-19: the changes after it.
	produceRaw(t, e.brokers, e.topic, append(cdc(13, 16), cdc(17, 19)...))

	reset := []string{"offsets", "reset", "--group", e.group, "--topic", e.topic, "--partition", "0", "--to-offset", "17", "--mode", "skip",
		"--reason", "seed incident: bad batch 13-16"}
	// dagtrigger is a static member (--instance-id): the group empties when its session times out.
	out, code := kafkatxCLI(t, cli, e, reset...)
	for deadline := time.Now().Add(30 * time.Second); code == 5 && time.Now().Before(deadline); {
		time.Sleep(2 * time.Second)
		out, code = kafkatxCLI(t, cli, e, reset...)
	}
	if code != 0 || !strings.Contains(out, "airflow ledger "+e.topic+"[0]: 12 rows at offsets [0, 17)") || !strings.Contains(out, "--clear-airflow --execute") {
		t.Fatalf("dry run without Airflow access (exit %d) does not name the 12 ledger rows below the skip and how to clear them:\n%s", code, out)
	}
	out, code = kafkatxCLI(t, cli, e, append(reset, auth...)...)
	if code != 0 || strings.Count(out, "would be marked failed") != 4 || !strings.Contains(out, "4 queued") {
		t.Fatalf("dry run with Airflow access (exit %d) does not name the 4 queued runs:\n%s", code, out)
	}
	out, code = kafkatxCLI(t, cli, e, append(reset, append(auth, "--clear-airflow", "--execute")...)...)
	if code != 0 || strings.Count(out, ") marked failed") != 4 || !strings.Contains(out, "4 queued runs marked failed") {
		t.Fatalf("the skip with --clear-airflow (exit %d) did not mark the 4 queued runs failed:\n%s", code, out)
	}
	t.Logf("the skip with --clear-airflow:\n%s", out)

	// In Airflow: the 4 runs failed, each with the note naming the skip.
	pool, err := pgxpool.New(context.Background(), e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var runIDs []string
	rows, err := pool.Query(context.Background(), `SELECT run_id FROM kafkatx.airflow_ledger WHERE group_id = $1 AND target = 'dag_run' ORDER BY "offset"`, e.group)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		runIDs = append(runIDs, id)
	}
	rows.Close()
	for _, id := range runIDs {
		var r struct {
			State string  `json:"state"`
			Note  *string `json:"note"`
		}
		if _, err := af.do(http.MethodGet, "/api/v2/dags/"+incidentLoadDAG+"/dagRuns/"+id, nil, &r); err != nil {
			t.Fatal(err)
		}
		if r.State != "failed" || r.Note == nil || !strings.HasPrefix(*r.Note, "kafkatx: cleared with an operator skip") || !strings.Contains(*r.Note, "seed incident") {
			t.Errorf("run %s: state %s, note %v; want failed with the skip's note", id, r.State, r.Note)
		}
	}
	if len(runIDs) != 4 {
		t.Errorf("%d runs in the ledger, want 4", len(runIDs))
	}

	// The changes after the skip, then the lockstep check.
	if sum := e.finish(t, 2, asset...); sum["dead_lettered"] != 0 {
		t.Fatalf("last asset pass: summary %v", sum)
	}
	out, code = kafkatxCLI(t, cli, e, append([]string{"airflow", "status", "--group", e.group}, auth...)...)
	if code != 0 || !strings.Contains(out, "aligned: 15 ledger entries") || !strings.Contains(out, "4 runs marked failed by an operator's skip") {
		t.Fatalf("airflow status at the end: exit %d, want 0 (aligned, 15 entries, the 4 cleared runs counted):\n%s", code, out)
	}

	// Every event once: each offset in exactly one of the ledger (once), the dead letters
	// (once) and the operator skip's range.
	at := map[int64]int{}
	count := func(q string, args ...any) {
		rows, err := pool.Query(context.Background(), q, args...)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var off int64
			if err := rows.Scan(&off); err != nil {
				t.Fatal(err)
			}
			at[off]++
		}
	}
	count(`SELECT "offset" FROM kafkatx.airflow_ledger WHERE group_id = $1`, e.group)
	count(`SELECT "offset" FROM kafkatx.dead_letters WHERE group_id = $1`, e.group)
	count(`SELECT generate_series(from_offset, to_offset - 1) FROM kafkatx.offset_audit WHERE group_id = $1 AND kind = 'operator_skip'`, e.group)
	for off := int64(0); off < 20; off++ {
		if at[off] != 1 {
			t.Errorf("offset %d accounted %d times (ledger, dead letters, skip), want once", off, at[off])
		}
	}
	var clears int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM kafkatx.offset_audit WHERE group_id = $1 AND kind = 'airflow_clear' AND from_offset = 9 AND to_offset = 13`, e.group).Scan(&clears); err != nil || clears != 1 {
		t.Errorf("airflow_clear audit rows of [9, 13): %d (%v), want 1", clears, err)
	}
	// Each asset event once in Airflow.
	var assetID int64
	var assets struct {
		Assets []struct {
			ID   int64  `json:"id"`
			Name string `json:"name"`
		} `json:"assets"`
	}
	if _, err := af.do(http.MethodGet, "/api/v2/assets?name_pattern=kafkatx_customers&limit=100", nil, &assets); err != nil {
		t.Fatal(err)
	}
	for _, a := range assets.Assets {
		if a.Name == "kafkatx_customers" {
			assetID = a.ID
		}
	}
	// The queue endpoints the clear uses exist in this Airflow (no DAG of the test waits on the
	// asset deterministically: a paused DAG gets no queue row, an unpaused one is run at once):
	// the asset's queue reads, and a delete for a DAG not scheduled on it is the handler's 404.
	var queued struct {
		Total *int `json:"total_entries"`
	}
	if _, err := af.do(http.MethodGet, "/api/v2/assets/"+strconv.FormatInt(assetID, 10)+"/queuedEvents", nil, &queued); err != nil || queued.Total == nil {
		t.Errorf("GET the asset's queue: %v", err)
	}
	if code, err := af.do(http.MethodDelete, "/api/v2/dags/"+incidentLoadDAG+"/assets/"+strconv.FormatInt(assetID, 10)+"/queuedEvents", nil, nil); code != http.StatusNotFound || err == nil || !strings.Contains(err.Error(), "Queued event with dag_id") {
		t.Errorf("DELETE a queue row that does not exist: %d %v; want Airflow's 404 naming the queued event", code, err)
	}
	ids := ledger(t, e)
	seen := map[string]int{}
	since := started.UTC().Add(-time.Minute).Format("2006-01-02T15:04:05.000000Z")
	for offset := 0; ; offset += 100 {
		var page struct {
			Events []struct {
				Extra map[string]any `json:"extra"`
			} `json:"asset_events"`
		}
		path := "/api/v2/assets/events?asset_id=" + strconv.FormatInt(assetID, 10) + "&timestamp_gte=" + since + "&order_by=timestamp&limit=100&offset=" + strconv.Itoa(offset)
		if _, err := af.do(http.MethodGet, path, nil, &page); err != nil {
			t.Fatal(err)
		}
		for _, ev := range page.Events {
			if id, _ := ev.Extra["kafkatx_id"].(string); ids[id] != nil {
				seen[id]++
			}
		}
		if len(page.Events) < 100 {
			break
		}
	}
	if len(seen) != 11 {
		t.Errorf("%d of the ledger's kafkatx_ids on kafkatx_customers, want 11", len(seen))
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("kafkatx_id %s: %d asset events, want 1", id, n)
		}
	}
	b, _ := json.Marshal(seen)
	t.Logf("incident replayed in %s; asset events %s", time.Since(started).Round(time.Second), b)
}
