package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"sort"
	"strings"
	"testing"

	"github.com/kafkatx/kafkatx/idempotency/airflow"
	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

// e2eDAG is the DAG the test starts runs of: examples/dags' kafkatx_load, paused at creation, so
// its runs stay queued (Airflow answers 409 to deleting a run that is running, which a run of an
// unpaused DAG may be by then).
const e2eDAG = "kafkatx_load"

// realAirflowAPI sends an API request to the real Airflow with a token from /auth/token.
func realAirflowAPI(t *testing.T, method, path string, out any) int {
	t.Helper()
	url, user, pwFile := os.Getenv("AIRFLOW_URL"), os.Getenv("AIRFLOW_USERNAME"), os.Getenv("AIRFLOW_PASSWORD_FILE")
	pw, err := os.ReadFile(pwFile)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(map[string]string{"username": user, "password": strings.TrimSpace(string(pw))})
	resp, err := http.Post(url+"/auth/token", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	var tok struct {
		AccessToken string `json:"access_token"`
	}
	err = json.NewDecoder(resp.Body).Decode(&tok)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(method, url+"/api/v2"+path, nil)
	req.Header.Set("Authorization", "Bearer "+tok.AccessToken)
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	body, _ := io.ReadAll(r.Body)
	if out != nil && r.StatusCode < 300 {
		if err := json.Unmarshal(body, out); err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
	}
	return r.StatusCode
}

// Against the real Airflow 3.3.2 (scripts/dev-services up airflow): 6 runs and 3 asset events
// handed over and recorded in the ledger; 2 runs and nothing else deleted through Airflow's
// API; `kafkatx airflow status --output json` exits 3 naming exactly the 2 missing;
// `kafkatx airflow repair` re-creates them under their run ids with their conf and writes one
// airflow_repair audit row; a second repair creates nothing; status is aligned (exit 0) with
// a bound that leaves the queued runs alone.
func TestRealAirflowStatusAndRepair(t *testing.T) {
	testenv.FullTier(t, "needs a real Apache Airflow (scripts/dev-services up airflow)")
	if os.Getenv("AIRFLOW_URL") == "" || os.Getenv("AIRFLOW_USERNAME") == "" || os.Getenv("AIRFLOW_PASSWORD_FILE") == "" {
		testenv.Unavailable(t, "a real Airflow: AIRFLOW_URL, AIRFLOW_USERNAME and AIRFLOW_PASSWORD_FILE are unset (scripts/dev-services up airflow && eval \"$(scripts/dev-services env)\")")
	}
	if code := realAirflowAPI(t, http.MethodGet, "/dags/"+e2eDAG, nil); code != 200 {
		testenv.Unavailable(t, "Airflow has no DAG %s (%d): examples/dags not loaded", e2eDAG, code)
	}
	ctx := context.Background()
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	if _, err := migrations.Apply(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	c, err := airflow.New(airflow.Config{BaseURL: os.Getenv("AIRFLOW_URL"), Username: os.Getenv("AIRFLOW_USERNAME"), PasswordFile: os.Getenv("AIRFLOW_PASSWORD_FILE")})
	if err != nil {
		t.Fatal(err)
	}
	group := fmt.Sprintf("afl_e2e_%08x", rand.Uint32())
	var runIDs []string
	t.Cleanup(func() {
		for _, id := range runIDs {
			realAirflowAPI(t, http.MethodDelete, "/dags/"+e2eDAG+"/dagRuns/"+id, nil)
		}
	})
	record := func(e airflow.LedgerEntry) {
		t.Helper()
		tx, err := pool.Begin(ctx)
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
	for i := 0; i < 6; i++ {
		key := fmt.Sprintf("%s-%d", group, i)
		conf := json.RawMessage(fmt.Sprintf(`{"id": %d, "group": %q}`, i, group))
		res, err := c.TriggerDAGRun(ctx, airflow.Trigger{DAGID: e2eDAG, Key: key, Conf: conf})
		if err != nil {
			t.Fatal(err)
		}
		runIDs = append(runIDs, res.RunID)
		record(airflow.LedgerEntry{Group: group, Topic: "cdc", Partition: int32(i % 2), Offset: int64(i), Key: key, Target: airflow.TargetDAGRun,
			DAGID: e2eDAG, RunID: res.RunID, Payload: conf, Outcome: airflow.OutcomeCreated})
	}
	for i := 0; i < 3; i++ {
		id := fmt.Sprintf("kafkatx__%s-a%d", group, i)
		extra := map[string]any{airflow.KafkatxIDKey: id, "row": map[string]int{"id": i}}
		res, err := c.CreateAssetEvent(ctx, airflow.AssetEvent{Asset: "kafkatx_customers", KafkatxID: id, Extra: extra})
		if err != nil {
			t.Fatal(err)
		}
		payload, _ := json.Marshal(extra)
		record(airflow.LedgerEntry{Group: group, Topic: "cdc", Partition: 2, Offset: int64(i), Key: id, Target: airflow.TargetAssetEvent,
			AssetID: res.AssetID, AssetName: "kafkatx_customers", AssetEventID: res.EventID, KafkatxID: id, Payload: payload, Outcome: airflow.OutcomeCreated})
	}
	for _, id := range runIDs[1:3] {
		if code := realAirflowAPI(t, http.MethodDelete, "/dags/"+e2eDAG+"/dagRuns/"+id, nil); code >= 300 {
			t.Fatalf("delete run %s: %d", id, code)
		}
	}
	bin := buildCLI(t)
	common := []string{"--database-url", os.Getenv("DATABASE_URL"), "--schema", schema, "--group", group, "--airflow-url", os.Getenv("AIRFLOW_URL"),
		"--airflow-username", os.Getenv("AIRFLOW_USERNAME"), "--airflow-password-file", os.Getenv("AIRFLOW_PASSWORD_FILE")}
	out, errOut, code := runCLI(t, bin, append([]string{"airflow", "status", "--queued-for", "24h", "--output", "json"}, common...)...)
	var missing []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var d map[string]any
		if json.Unmarshal([]byte(line), &d) == nil && d["kind"] == driftMissing {
			missing = append(missing, fmt.Sprint(d["run_id"]))
		}
	}
	sort.Strings(missing)
	if code != offsetsExitDrift || strings.Join(missing, ",") != strings.Join(runIDs[1:3], ",") {
		t.Fatalf("status after 2 runs were deleted: exit %d, missing %v (want 3 and %v)\n%s%s", code, missing, runIDs[1:3], out, errOut)
	}
	if strings.Contains(out+errOut, "password") && strings.Contains(out+errOut, "s3cret") {
		t.Error("a secret in the output")
	}
	if out, errOut, code := runCLI(t, bin, append([]string{"airflow", "repair", "--reason", "e2e: deleted runs"}, common...)...); code != 0 || !strings.Contains(out, "re-created 2 of 2 missing") {
		t.Fatalf("repair: exit %d\n%s%s", code, out, errOut)
	}
	for i, id := range runIDs[1:3] {
		var run airflow.DAGRunInfo
		if code := realAirflowAPI(t, http.MethodGet, "/dags/"+e2eDAG+"/dagRuns/"+id, &run); code != 200 {
			t.Fatalf("run %s after the repair: %d", id, code)
		}
		var conf struct {
			ID    int    `json:"id"`
			Group string `json:"group"`
		}
		if json.Unmarshal(run.Conf, &conf) != nil || conf.ID != i+1 || conf.Group != group {
			t.Errorf("re-created run %s has conf %s, want its own", id, run.Conf)
		}
	}
	events, err := offsetstore.New(schema).Events(ctx, pool, group, "cdc")
	if err != nil {
		t.Fatal(err)
	}
	repairs := 0
	for _, e := range events {
		if e.Kind == offsetstore.KindAirflowRepair {
			repairs++
			if e.Actor == "" || !strings.HasPrefix(e.Reason, "e2e: deleted runs") {
				t.Errorf("audit row %+v: want the actor and the reason", e)
			}
		}
	}
	if repairs != 2 { // offsets 1 and 2 are on partitions 1 and 0
		t.Errorf("%d airflow_repair audit rows, want one per partition repaired (2): %+v", repairs, events)
	}
	if out, errOut, code := runCLI(t, bin, append([]string{"airflow", "repair", "--reason", "e2e: again"}, common...)...); code != 0 || !strings.Contains(out, "re-created 0 of 0 missing") {
		t.Errorf("second repair: exit %d\n%s%s", code, out, errOut)
	}
	if out, errOut, code := runCLI(t, bin, append([]string{"airflow", "status", "--queued-for", "24h"}, common...)...); code != 0 {
		t.Errorf("status after the repair: exit %d, want 0 (aligned)\n%s%s", code, out, errOut)
	}
}
