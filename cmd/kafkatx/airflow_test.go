package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kafkatx/kafkatx/idempotency/airflow"
	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

// standIn is an httptest stand-in of Airflow 3's REST API v2 for airflow status and repair:
// DAGs (is_paused, max_active_runs), their runs (list paged at most 100, newest first; get
// by id; create with 409 on an existing id), assets by name and their events (list paged;
// create). It counts the requests of each kind.
type standIn struct {
	mu     sync.Mutex
	dags   map[string]*standInDAG
	events []map[string]any
	gets   map[string]int // "list", "get", "dag", "running", "assets", "events"
	posts  int
}

type standInDAG struct {
	paused    bool
	maxActive int
	runs      []map[string]any // dag_run_id, state, queued_at, run_after, conf
}

func newStandIn(t *testing.T) (*standIn, *airflow.Client) {
	s := &standIn{dags: map[string]*standInDAG{}, gets: map[string]int{}}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	c, err := airflow.New(airflow.Config{BaseURL: srv.URL, InitialBackoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

func (s *standIn) addRun(dag, id, state string, queuedAt time.Time) {
	d := s.dags[dag]
	if d == nil {
		d = &standInDAG{maxActive: 16}
		s.dags[dag] = d
	}
	d.runs = append(d.runs, map[string]any{"dag_id": dag, "dag_run_id": id, "state": state, "queued_at": queuedAt.UTC().Format(time.RFC3339Nano),
		"run_after": queuedAt.UTC().Format(time.RFC3339Nano), "conf": map[string]any{}})
}

func (s *standIn) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/api/v2/"), "/")
	q := r.URL.Query()
	limit, _ := strconv.Atoi(q.Get("limit"))
	offset, _ := strconv.Atoi(q.Get("offset"))
	// Airflow 3.3 refuses an order_by its model does not allow (asset events: not id).
	if o := q.Get("order_by"); o != "" && o != "-run_after" && o != "timestamp" {
		http.Error(w, `{"detail":"Ordering with '`+o+`' is disallowed"}`, http.StatusBadRequest)
		return
	}
	if r.Method == http.MethodGet && q.Has("limit") && (limit < 1 || limit > 100) {
		http.Error(w, `{"detail":"limit"}`, http.StatusBadRequest)
		return
	}
	page := func(items []map[string]any) []map[string]any {
		return items[min(offset, len(items)):min(offset+limit, len(items))]
	}
	switch {
	case parts[0] == "dags" && len(parts) >= 2:
		d := s.dags[parts[1]]
		if d == nil {
			http.Error(w, `{"detail":"no such DAG"}`, http.StatusNotFound)
			return
		}
		switch {
		case len(parts) == 2:
			s.gets["dag"]++
			_ = json.NewEncoder(w).Encode(map[string]any{"dag_id": parts[1], "is_paused": d.paused, "max_active_runs": d.maxActive})
		case len(parts) == 3 && r.Method == http.MethodPost:
			s.posts++
			var body map[string]any
			_ = json.NewDecoder(r.Body).Decode(&body)
			for _, run := range d.runs {
				if run["dag_run_id"] == body["dag_run_id"] {
					http.Error(w, `{"detail":"exists"}`, http.StatusConflict)
					return
				}
			}
			s.addRun(parts[1], body["dag_run_id"].(string), "queued", time.Now())
			_ = json.NewEncoder(w).Encode(body)
		case len(parts) == 3 && q.Get("state") == "running":
			s.gets["running"]++
			n := 0
			for _, run := range d.runs {
				if run["state"] == "running" {
					n++
				}
			}
			_ = json.NewEncoder(w).Encode(map[string]any{"dag_runs": []any{}, "total_entries": n})
		case len(parts) == 3:
			s.gets["list"]++
			runs := append([]map[string]any(nil), d.runs...)
			sort.SliceStable(runs, func(i, j int) bool { return runs[i]["run_after"].(string) > runs[j]["run_after"].(string) })
			if gte := q.Get("run_after_gte"); gte != "" {
				var keep []map[string]any
				for _, run := range runs {
					if run["run_after"].(string) >= gte[:19] {
						keep = append(keep, run)
					}
				}
				runs = keep
			}
			_ = json.NewEncoder(w).Encode(map[string]any{"dag_runs": page(runs), "total_entries": len(runs)})
		case len(parts) == 4:
			s.gets["get"]++
			for _, run := range d.runs {
				if run["dag_run_id"] == parts[3] {
					_ = json.NewEncoder(w).Encode(run)
					return
				}
			}
			http.Error(w, `{"detail":"no such run"}`, http.StatusNotFound)
		}
	case r.URL.Path == "/api/v2/assets":
		s.gets["assets"]++
		fmt.Fprint(w, `{"assets":[{"id":5,"name":"kafkatx_customers"}],"total_entries":1}`)
	case r.URL.Path == "/api/v2/assets/events" && r.Method == http.MethodPost:
		s.posts++
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		ev := map[string]any{"id": len(s.events) + 1, "asset_id": 5, "extra": body["extra"], "timestamp": time.Now().UTC().Format(time.RFC3339Nano)}
		s.events = append(s.events, ev)
		_ = json.NewEncoder(w).Encode(ev)
	case r.URL.Path == "/api/v2/assets/events":
		s.gets["events"]++
		_ = json.NewEncoder(w).Encode(map[string]any{"asset_events": page(s.events), "total_entries": len(s.events)})
	default:
		http.Error(w, `{"detail":"not found"}`, http.StatusNotFound)
	}
}

func runEntry(off int64, id string, at time.Time) airflow.LedgerEntry {
	return airflow.LedgerEntry{ID: off + 1, Group: "g", Topic: "t", Partition: 1, Offset: off, Key: id, Target: airflow.TargetDAGRun,
		DAGID: "process_customer", RunID: id, Payload: json.RawMessage(fmt.Sprintf(`{"id": %d}`, off)), Outcome: airflow.OutcomeCreated, CreatedAt: at}
}

// 250 runs in the ledger, read from Airflow in pages of at most 100 (no GET per run): five
// deleted are missing, one failed, one queued past the bound in a DAG at max_active_runs;
// the JSON lines name each with its position; exit 3. Repair re-creates the five under their
// run ids with their conf, audits nothing here (no database), and a second repair creates
// nothing; the status is then aligned but for the failed and queued ones.
func TestAirflowStatusPagesAndNamesDrift(t *testing.T) {
	s, c := newStandIn(t)
	ctx := context.Background()
	now := time.Now()
	var entries []airflow.LedgerEntry
	for i := int64(0); i < 250; i++ {
		id := fmt.Sprintf("kafkatx__r%03d", i)
		entries = append(entries, runEntry(i, id, now.Add(-time.Hour)))
		state := "success"
		switch i {
		case 7:
			state = "failed"
		case 8:
			state = "queued"
		}
		if i >= 100 && i < 105 {
			continue // deleted in Airflow
		}
		s.addRun("process_customer", id, state, now.Add(-time.Hour+time.Duration(i)*time.Second))
	}
	s.dags["process_customer"].maxActive = 1
	s.addRun("process_customer", "someone_else", "running", now)
	rep, err := compareAirflow(ctx, c, entries, 10*time.Minute, now)
	if err != nil {
		t.Fatal(err)
	}
	if s.gets["list"] != 3 || s.gets["get"] != 5 {
		t.Errorf("%d list pages and %d runs read one by one; want 3 pages (251 runs, 100 a page) and only the 5 missing read by id", s.gets["list"], s.gets["get"])
	}
	var out bytes.Buffer
	err = printAirflowStatus(&out, "g", "json", rep)
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != offsetsExitDrift {
		t.Fatalf("status with drift returned %v, want exit %d", err, offsetsExitDrift)
	}
	kinds := map[string][]int64{}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var d map[string]any
		if err := json.Unmarshal([]byte(line), &d); err != nil {
			t.Fatalf("not a JSON line: %q", line)
		}
		kinds[d["kind"].(string)] = append(kinds[d["kind"].(string)], int64(d["offset"].(float64)))
		if d["topic"] != "t" || d["partition"].(float64) != 1 || d["dag_id"] != "process_customer" || d["run_id"] == "" {
			t.Errorf("line %s lacks its position or run", line)
		}
		if r, ok := d["reason"]; d["kind"] == driftQueued && (!ok || r != reasonMaxActiveRuns) {
			t.Errorf("queued line %s: want reason %s", line, reasonMaxActiveRuns)
		} else if ok && d["kind"] != driftQueued {
			t.Errorf("line %s has a reason but is not queued", line)
		}
	}
	if fmt.Sprint(kinds[driftMissing]) != "[100 101 102 103 104]" || fmt.Sprint(kinds[driftFailed]) != "[7]" || fmt.Sprint(kinds[driftQueued]) != "[8]" {
		t.Errorf("drift %v, want missing 100-104, failed 7, queued 8", kinds)
	}

	res, err := repairAirflow(ctx, c, rep, false, io.Discard)
	if err != nil || res.created != 5 || len(res.failed) != 0 {
		t.Fatalf("repair: %+v %v, want 5 re-created", res, err)
	}
	if p := res.partitions(); len(p) != 1 || p[0].from != 100 || p[0].to != 105 || p[0].runs != 5 {
		t.Errorf("repaired range %+v, want t[1] [100, 105) 5 runs", p)
	}
	for _, run := range s.dags["process_customer"].runs {
		if run["dag_run_id"] == "kafkatx__r102" && fmt.Sprint(run["state"]) != "queued" {
			t.Errorf("re-created run %v", run)
		}
	}
	again, err := repairAirflow(ctx, c, rep, false, io.Discard) // the same (stale) report: Airflow answers 409
	if err != nil || again.created != 0 || again.existed != 5 {
		t.Errorf("a second repair: %+v %v, want nothing created and 5 found existing", again, err)
	}
	rep2, err := compareAirflow(ctx, c, entries, 10*time.Minute, now)
	if err != nil {
		t.Fatal(err)
	}
	if rep2.count(driftMissing) != 0 || rep2.count(driftFailed) != 1 || rep2.count(driftQueued) != 1 {
		t.Errorf("after the repair: %d missing, %d failed, %d queued; want 0, 1, 1", rep2.count(driftMissing), rep2.count(driftFailed), rep2.count(driftQueued))
	}
}

// A paused DAG: runs queued for less than --queued-for are aligned (exit 0); past it, each is
// named queued with reason dag_paused.
func TestAirflowStatusPausedDAG(t *testing.T) {
	s, c := newStandIn(t)
	now := time.Now()
	var entries []airflow.LedgerEntry
	for i := int64(0); i < 3; i++ {
		id := fmt.Sprintf("kafkatx__p%d", i)
		entries = append(entries, runEntry(i, id, now.Add(-2*time.Minute)))
		s.addRun("process_customer", id, "queued", now.Add(-2*time.Minute))
	}
	s.dags["process_customer"].paused = true
	rep, err := compareAirflow(context.Background(), c, entries, 10*time.Minute, now)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := printAirflowStatus(&out, "g", "text", rep); err != nil || !strings.HasPrefix(out.String(), "aligned: 3 ledger entries") {
		t.Errorf("paused DAG, runs queued 2m, bound 10m: %v %q, want aligned", err, out.String())
	}
	rep, err = compareAirflow(context.Background(), c, entries, time.Minute, now)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(rep.Drift); n != 3 {
		t.Fatalf("bound 1m: %d drift, want 3 queued", n)
	}
	for _, d := range rep.Drift {
		if d.Kind != driftQueued || d.Reason == nil || *d.Reason != reasonPaused {
			t.Errorf("drift %+v, want queued dag_paused", d)
		}
	}
}

// Asset events: the ledger's kafkatx_ids are matched in Airflow's events of the asset; one
// missing is named; repair posts it once (a read-back first) and a second repair nothing.
func TestAirflowStatusAssetEvents(t *testing.T) {
	s, c := newStandIn(t)
	ctx := context.Background()
	now := time.Now()
	var entries []airflow.LedgerEntry
	for i := int64(0); i < 4; i++ {
		id := fmt.Sprintf("kafkatx__a%d", i)
		entries = append(entries, airflow.LedgerEntry{ID: i + 1, Group: "g", Topic: "t", Partition: 0, Offset: i, Key: id, Target: airflow.TargetAssetEvent,
			AssetName: "kafkatx_customers", KafkatxID: id, Payload: json.RawMessage(`{"kafkatx_id":"` + id + `","row":{"id":1}}`), Outcome: airflow.OutcomeCreated, CreatedAt: now})
		if i != 2 {
			s.events = append(s.events, map[string]any{"id": len(s.events) + 1, "asset_id": 5, "extra": map[string]any{"kafkatx_id": id}, "timestamp": now.UTC().Format(time.RFC3339Nano)})
		}
	}
	rep, err := compareAirflow(ctx, c, entries, time.Minute, now)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Drift) != 1 || rep.Drift[0].Kind != driftMissing || rep.Drift[0].KafkatxID != "kafkatx__a2" || rep.Drift[0].Asset != "kafkatx_customers" {
		t.Fatalf("drift %+v, want kafkatx__a2 missing", rep.Drift)
	}
	for i := 0; i < 2; i++ {
		if _, err := repairAirflow(ctx, c, rep, false, io.Discard); err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	for _, ev := range s.events {
		if ev["extra"].(map[string]any)["kafkatx_id"] == "kafkatx__a2" {
			n++
		}
	}
	if n != 1 || s.posts != 1 {
		t.Errorf("after two repairs Airflow has kafkatx__a2 %d times (%d posts), want once", n, s.posts)
	}
}

// Bad input is exit 2 with one line naming the flag, before anything connects, and no secret
// in the output; a group with no ledger row is exit 7; --dry-run re-creates nothing.
func TestAirflowCommandsExitStatuses(t *testing.T) {
	bin := buildCLI(t)
	pw := t.TempDir() + "/pw"
	if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"--database-url", "postgres://u@127.0.0.1:1/x", "--group", "g"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"airflow", "status", "--group", "g"}, "--airflow-url"},
		{append([]string{"airflow", "status", "--airflow-url", "ftp://x"}, base...), "--airflow-url"},
		{append([]string{"airflow", "status", "--airflow-url", "http://u:s3cret@h:1"}, base...), "must not carry credentials"},
		{append([]string{"airflow", "status", "--airflow-url", "http://h:1", "--from", "5", "--to", "3"}, base...), "--from 5 --to 3"},
		{append([]string{"airflow", "status", "--airflow-url", "http://h:1", "--airflow-username", "admin"}, base...), "go together"},
		{append([]string{"airflow", "status", "--airflow-url", "http://h:1", "--airflow-token-file", pw, "--airflow-username", "a", "--airflow-password-file", pw}, base...), "excludes"},
		{append([]string{"airflow", "status", "--airflow-url", "http://h:1", "--airflow-token-file", "/nonexistent/token"}, base...), "--airflow-token-file"},
		{append([]string{"airflow", "status", "--airflow-url", "http://h:1", "--queued-for", "0s"}, base...), "--queued-for"},
		{append([]string{"airflow", "status", "--airflow-url", "http://h:1", "--output", "yaml"}, base...), "--output"},
		{append([]string{"airflow", "repair", "--airflow-url", "http://h:1", "--reason", " "}, base...), "--reason is empty"},
		{append([]string{"airflow", "status", "--airflow-url", "http://h:1", "--partition", "-1"}, base...), "--partition -1"},
	} {
		testenv.RequireUsageError(t, bin, c.args, nil, c.want)
	}

	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	if _, err := migrations.Apply(context.Background(), pool, schema); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := runCLI(t, bin, "airflow", "status", "--database-url", os.Getenv("DATABASE_URL"), "--schema", schema, "--group", "nobody", "--airflow-url", "http://127.0.0.1:1")
	if code != offsetsExitUnknown || !strings.Contains(errOut, "no row for group nobody") {
		t.Errorf("status of a group without ledger rows: exit %d %q, want %d", code, errOut, offsetsExitUnknown)
	}
}

// --dry-run names what it would re-create and creates nothing.
func TestAirflowRepairDryRun(t *testing.T) {
	s, c := newStandIn(t)
	now := time.Now()
	entries := []airflow.LedgerEntry{runEntry(0, "kafkatx__gone", now)}
	s.addRun("process_customer", "someone_else", "success", now)
	rep, err := compareAirflow(context.Background(), c, entries, time.Minute, now)
	if err != nil || rep.count(driftMissing) != 1 {
		t.Fatalf("%+v %v, want 1 missing", rep, err)
	}
	var out bytes.Buffer
	res, err := repairAirflow(context.Background(), c, rep, true, &out)
	if err != nil || s.posts != 0 || len(res.done) != 0 || !strings.Contains(out.String(), "would re-create run process_customer/kafkatx__gone (t[1]@0)") {
		t.Errorf("dry run: %v, %d posts, %q", err, s.posts, out.String())
	}
}
