package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/idempotency"
	"github.com/kafkatx/kafkatx/idempotency/airflow"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

// realAirflow is the Airflow 3 that `scripts/dev-services up airflow` runs (make test starts
// it): its API, credentials, and the address where its tasks call examples/dagservice.
type realAirflow struct {
	url, username, passwordFile, serviceAddr string
	http                                     *http.Client

	mu    sync.Mutex
	token string
}

func needAirflow(t *testing.T) *realAirflow {
	t.Helper()
	testenv.FullTier(t, "needs a real Apache Airflow (scripts/dev-services up airflow)")
	a := &realAirflow{url: os.Getenv("AIRFLOW_URL"), username: os.Getenv("AIRFLOW_USERNAME"),
		passwordFile: os.Getenv("AIRFLOW_PASSWORD_FILE"), serviceAddr: os.Getenv("AIRFLOW_DAGSERVICE_ADDR"),
		http: &http.Client{Timeout: 30 * time.Second}}
	if a.url == "" || a.username == "" || a.passwordFile == "" || a.serviceAddr == "" {
		testenv.Unavailable(t, "a real Airflow: AIRFLOW_URL, AIRFLOW_USERNAME, AIRFLOW_PASSWORD_FILE and AIRFLOW_DAGSERVICE_ADDR are unset (scripts/dev-services up airflow && eval \"$(scripts/dev-services env)\")")
	}
	var dag struct {
		IsPaused bool `json:"is_paused"`
	}
	if code, err := a.do(http.MethodGet, "/api/v2/dags/process_customer", nil, &dag); err != nil || code != 200 {
		testenv.Unavailable(t, "Airflow at %s does not answer for DAG process_customer: %d %v", a.url, code, err)
	}
	return a
}

// do sends an API request with a token from /auth/token and decodes the JSON answer into out.
func (a *realAirflow) do(method, path string, body, out any) (int, error) {
	a.mu.Lock()
	if a.token == "" {
		pw, err := os.ReadFile(a.passwordFile)
		if err != nil {
			a.mu.Unlock()
			return 0, err
		}
		b, _ := json.Marshal(map[string]string{"username": a.username, "password": strings.TrimSpace(string(pw))})
		resp, err := a.http.Post(a.url+"/auth/token", "application/json", bytes.NewReader(b))
		if err != nil {
			a.mu.Unlock()
			return 0, err
		}
		var tok struct {
			AccessToken string `json:"access_token"`
		}
		err = json.NewDecoder(resp.Body).Decode(&tok)
		resp.Body.Close()
		if err != nil || tok.AccessToken == "" {
			a.mu.Unlock()
			return resp.StatusCode, fmt.Errorf("token exchange: %d %v", resp.StatusCode, err)
		}
		a.token = tok.AccessToken
	}
	token := a.token
	a.mu.Unlock()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	var resp *http.Response
	var err error
	for try := 1; ; try++ {
		req, _ := http.NewRequest(method, a.url+path, rd)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err = a.http.Do(req)
		// A loaded 2-core machine makes the single api-server worker slow at times: the
		// reads and the clear (idempotent: a second clear of a cleared task changes nothing
		// the test checks) are tried again.
		if err == nil && resp.StatusCode < 500 || try == 5 {
			break
		}
		if err == nil {
			resp.Body.Close()
		}
		time.Sleep(2 * time.Second)
		if body != nil {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
	}
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		return resp.StatusCode, fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, b)
	}
	if out != nil {
		return resp.StatusCode, json.Unmarshal(b, out)
	}
	return resp.StatusCode, nil
}

type dagRun struct {
	RunID string          `json:"dag_run_id"`
	State string          `json:"state"`
	Conf  json.RawMessage `json:"conf"`
}

type taskInstance struct {
	TaskID   string `json:"task_id"`
	MapIndex int    `json:"map_index"`
	State    string `json:"state"`
	Try      int    `json:"try_number"`
	PID      int    `json:"pid"`
}

// runs lists the DAG's runs whose conf carries tag.
func (a *realAirflow) runs(t *testing.T, tag string) map[string]dagRun {
	t.Helper()
	out := map[string]dagRun{}
	for offset := 0; ; offset += 100 {
		var page struct {
			Runs  []dagRun `json:"dag_runs"`
			Total int      `json:"total_entries"`
		}
		if _, err := a.do(http.MethodGet, fmt.Sprintf("/api/v2/dags/process_customer/dagRuns?limit=100&offset=%d", offset), nil, &page); err != nil {
			t.Fatal(err)
		}
		for _, r := range page.Runs {
			var c struct {
				Tag string `json:"e2e"`
			}
			if json.Unmarshal(r.Conf, &c) == nil && c.Tag == tag {
				out[r.RunID] = r
			}
		}
		if offset+100 >= page.Total {
			return out
		}
	}
}

func (a *realAirflow) taskInstance(runID, taskID string) (taskInstance, error) {
	var ti taskInstance
	_, err := a.do(http.MethodGet, "/api/v2/dags/process_customer/dagRuns/"+url.PathEscape(runID)+"/taskInstances/"+taskID, nil, &ti)
	return ti, err
}

// call is one request a task made to dagservice, as the proxy in front of it saw it.
type call struct {
	status   int // 0: the task went away before the answer
	replayed bool
	body     []byte
}

// serviceProxy stands where the DAG's tasks call dagservice (AIRFLOW_DAGSERVICE_ADDR) and
// forwards to it, recording every call by Idempotency-Key; onRequest runs as a call arrives.
type serviceProxy struct {
	mu        sync.Mutex
	calls     map[string][]call
	onRequest func(key string)
}

func (p *serviceProxy) record(key string, c call) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls[key] = append(p.calls[key], c)
}

func (p *serviceProxy) callsOf(key string) []call {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]call(nil), p.calls[key]...)
}

func startProxy(t *testing.T, listen, target string) *serviceProxy {
	t.Helper()
	p := &serviceProxy{calls: map[string][]call{}}
	u, _ := url.Parse("http://" + target)
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ModifyResponse = func(resp *http.Response) error {
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		resp.Body = io.NopCloser(bytes.NewReader(b))
		p.record(resp.Request.Header.Get("Idempotency-Key"), call{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed") == "true", body: b})
		return nil
	}
	rp.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
		p.record(r.Header.Get("Idempotency-Key"), call{}) // the task went away (or dagservice is down)
		w.WriteHeader(http.StatusBadGateway)
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatalf("listen on AIRFLOW_DAGSERVICE_ADDR %s: %v", listen, err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		hook := p.onRequest
		p.mu.Unlock()
		if hook != nil {
			hook(r.Header.Get("Idempotency-Key"))
		}
		rp.ServeHTTP(w, r)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return p
}

// runIDOf is the run id dagtrigger derives for an event (as trigger.handle does).
func runIDOf(kv [2][]byte) string {
	ev, err := idempotency.ParseDebezium(kv[1])
	if err != nil {
		panic(err)
	}
	key, err := ev.Key(kv[0]) // the key dagtrigger derives its run ids from
	if err != nil {
		panic(err)
	}
	return airflow.RunID("", key)
}

func waitListen(t *testing.T, addr string) {
	t.Helper()
	for deadline := time.Now().Add(120 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing listens on %s after 120s", addr)
		}
	}
}

// TestRealAirflowEndToEnd runs the whole path against a real Apache Airflow 3: change events →
// examples/dagtrigger (SIGKILLed mid-stream, tokens from /auth/token) → one DAG run per event →
// the example DAG's tasks → examples/dagservice, with one task instance SIGKILLed during its
// call (Airflow retries it) and one task cleared after its run succeeded (clearTaskInstances).
// It reads back from Airflow's API and the service's table: exactly one run per event, one
// effect per task instance.
func TestRealAirflowEndToEnd(t *testing.T) {
	af := needAirflow(t)
	const n = 16
	tag := fmt.Sprintf("%x", rand.Uint64())
	base := int64(rand.IntN(1<<30)) * 64 // source positions unique to this test run
	brokers := testenv.Brokers(t)
	e := &env{bin: buildBinary(t), brokers: brokers, dbURL: testenv.Database(t), topic: testenv.Topic(t, brokers, 3),
		group: testenv.Group(t), airflowURL: af.url, logDir: t.TempDir()}

	svcBin := filepath.Join(t.TempDir(), "dagservice")
	if out, err := exec.Command("go", "build", "-o", svcBin, "../dagservice").CombinedOutput(); err != nil {
		t.Fatalf("build dagservice: %v\n%s", err, out)
	}
	svcAddr := testenv.FreeAddr(t)
	svcLog, _ := os.Create(filepath.Join(e.logDir, "dagservice.log"))
	svc := exec.Command(svcBin, "--addr", svcAddr, "--database-url", e.dbURL, "--task-delay", "4s")
	svc.Stderr = svcLog
	if err := svc.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Process.Signal(syscall.SIGTERM); _ = svc.Wait(); svcLog.Close() })
	waitListen(t, svcAddr)
	proxy := startProxy(t, af.serviceAddr, svcAddr)

	event := func(i int) [2][]byte {
		return [2][]byte{fmt.Appendf(nil, `{"id":%d}`, i), fmt.Appendf(nil,
			`{"before":null,"after":{"id":%d,"status":"active","e2e":%q},"source":{"connector":"postgresql","db":"app","schema":"public","table":"customers","lsn":%d,"txId":%d},"op":"c","ts_ms":1790000000000}`,
			i, tag, base+int64(i)*64, base/64+int64(i))}
	}
	// The victim: event 3's score task, SIGKILLed 500 ms into its call to dagservice (which
	// then holds the call's transaction, in its 4 s of work: the kill reads the task instance
	// from the API first, which took over 1.5 s on a loaded machine).
	var victimRun string
	killed := make(chan error, 1)
	var once sync.Once
	proxy.mu.Lock()
	proxy.onRequest = func(key string) {
		parts := strings.Split(key, "/")
		if len(parts) != 4 || parts[2] != "score" {
			return
		}
		runID := parts[1]
		if runID != runIDOf(event(3)) {
			return
		}
		once.Do(func() {
			victimRun = runID
			go func() {
				time.Sleep(500 * time.Millisecond)
				ti, err := af.taskInstance(runID, "score")
				if err == nil && (ti.PID <= 0 || ti.State != "running") {
					err = fmt.Errorf("score of %s is %s with pid %d", runID, ti.State, ti.PID)
				}
				if err == nil {
					cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", ti.PID))
					if !bytes.Contains(cmdline, []byte("airflow")) {
						err = fmt.Errorf("pid %d is not an Airflow task process: %q", ti.PID, cmdline)
					} else {
						err = syscall.Kill(ti.PID, syscall.SIGKILL)
					}
				}
				killed <- err
			}()
		})
	}
	proxy.mu.Unlock()

	// dagtrigger reaches Airflow through a proxy that SIGKILLs it right after Airflow created
	// the 4th and the 11th run, before the answer reaches it: its transaction never commits,
	// and the restarted process must get Airflow's 409 for the same run id.
	var mu sync.Mutex
	var victim *exec.Cmd
	created, conflicts := 0, 0
	killAt := map[int]bool{4: true, 11: true}
	target, _ := url.Parse(af.url)
	afProxy := httputil.NewSingleHostReverseProxy(target)
	afProxy.ModifyResponse = func(resp *http.Response) error {
		if resp.Request.Method != http.MethodPost || !strings.HasSuffix(resp.Request.URL.Path, "/dagRuns") {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		switch resp.StatusCode {
		case http.StatusOK:
			created++
			if killAt[created] && victim != nil {
				_ = victim.Process.Signal(syscall.SIGKILL) // before the answer is relayed
				delete(killAt, created)
			}
		case http.StatusConflict:
			conflicts++
		}
		return nil
	}
	afProxy.ErrorLog = log.New(io.Discard, "", 0) // requests of a killed dagtrigger end "context canceled"
	afSrv := &http.Server{Handler: afProxy}
	afLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = afSrv.Serve(afLn) }()
	t.Cleanup(func() { _ = afSrv.Close() })
	e.airflowURL = "http://" + afLn.Addr().String()

	var kvs [][2][]byte
	for i := 1; i <= n; i++ {
		kvs = append(kvs, event(i))
	}
	produceRaw(t, e.brokers, e.topic, kvs)
	// --concurrency 1: the kills land after the 4th and the 11th create, which needs the
	// creates one at a time (with more, the first run creates nearly every run before its
	// kill lands, and the second never creates one). 15-lanes checks kills with 32.
	auth := []string{"--airflow-username", af.username, "--airflow-password-file", af.passwordFile, "--concurrency", "1"}
	for run := 0; run < 2; run++ {
		cmd, _ := e.start(t, run, auth...)
		mu.Lock()
		victim = cmd
		mu.Unlock()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(3 * time.Minute):
			t.Fatalf("dagtrigger run %d was not killed after a created run within 3 minutes", run)
		}
		mu.Lock()
		victim = nil
		mu.Unlock()
		if ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("dagtrigger run %d ended with %v, want the SIGKILL between Airflow's create and the commit", run, cmd.ProcessState)
		}
	}
	sum := e.finish(t, 9, auth...)
	if sum["dead_lettered"] != 0 {
		t.Fatalf("dagtrigger dead-lettered events: %v", sum)
	}
	mu.Lock()
	if conflicts < 2 {
		t.Errorf("Airflow answered 409 %d times after 2 kills between its create and dagtrigger's commit; want at least 2", conflicts)
	}
	t.Logf("dagtrigger: 2 SIGKILLs after a create, %d runs created, %d answered 409; final summary %v", created, conflicts, sum)
	mu.Unlock()

	// Every run finishes (the victim after its retry).
	var runs map[string]dagRun
	deadline := time.Now().Add(6 * time.Minute)
	for {
		runs = af.runs(t, tag)
		done := 0
		for _, r := range runs {
			if r.State == "success" || r.State == "failed" {
				done++
			}
		}
		if len(runs) >= n && done == len(runs) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 6 minutes %d of %d runs finished (%d runs)", done, n, len(runs))
		}
		time.Sleep(2 * time.Second)
	}
	perEvent := map[int]int{}
	for id, r := range runs {
		var c struct {
			ID int `json:"id"`
		}
		_ = json.Unmarshal(r.Conf, &c)
		perEvent[c.ID]++
		if r.State != "success" {
			t.Errorf("run %s (event %d) ended %s", id, c.ID, r.State)
		}
	}
	for i := 1; i <= n; i++ {
		if perEvent[i] != 1 {
			t.Errorf("event %d has %d runs in Airflow, want 1", i, perEvent[i])
		}
	}
	if len(runs) != n {
		t.Errorf("%d runs in Airflow for %d events", len(runs), n)
	}

	// The killed task instance was retried and its call ran once to completion.
	select {
	case err := <-killed:
		if err != nil {
			t.Fatalf("killing the task instance during its call: %v", err)
		}
	default:
		t.Fatal("no score call of event 3 reached dagservice")
	}
	ti, err := af.taskInstance(victimRun, "score")
	if err != nil || ti.Try < 2 || ti.State != "success" {
		t.Fatalf("killed score of %s: %+v %v; want success on try 2 or later", victimRun, ti, err)
	}
	victimKey := "process_customer/" + victimRun + "/score/-1"
	vc := proxy.callsOf(victimKey)
	if len(vc) < 2 || vc[0].status == 200 {
		t.Fatalf("calls of the killed task %v; want the killed call unanswered, then a retry", vc)
	}
	if last := vc[len(vc)-1]; last.status != 200 || last.replayed || !json.Valid(last.body) || len(last.body) == 0 {
		t.Fatalf("the retry of the killed task got %d replayed=%v %q; want a fresh 200 with the task's JSON", last.status, last.replayed, last.body)
	}

	// A cleared task runs again (try + 1) and gets its first answer replayed: no new effect.
	var cleared string
	for id := range runs {
		if id != victimRun {
			cleared = id
			break
		}
	}
	before, err := af.taskInstance(cleared, "score")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := af.do(http.MethodPost, "/api/v2/dags/process_customer/clearTaskInstances", map[string]any{
		"dry_run": false, "only_failed": false, "reset_dag_runs": true, "dag_run_id": cleared, "task_ids": []string{"score"}, "include_downstream": true,
	}, nil); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(2 * time.Second) {
		ti, err := af.taskInstance(cleared, "score")
		if err == nil && ti.Try > before.Try && ti.State == "success" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cleared score of %s: %+v %v after 3 minutes; want success on try %d", cleared, ti, err, before.Try+1)
		}
	}
	clearedKey := "process_customer/" + cleared + "/score/-1"
	cc := proxy.callsOf(clearedKey)
	if len(cc) < 2 || !cc[len(cc)-1].replayed || cc[len(cc)-1].status != 200 || !bytes.Equal(cc[len(cc)-1].body, cc[0].body) {
		t.Fatalf("calls of the cleared task: %+v; want its first answer replayed", cc)
	}

	// One effect per task instance: score, enrich[0], enrich[1], notify per run.
	pool, err := pgxpool.New(context.Background(), e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	rows, err := pool.Query(context.Background(), "SELECT idempotency_key, count(*) FROM task_results GROUP BY 1")
	if err != nil {
		t.Fatal(err)
	}
	effects := map[string]int{}
	for rows.Next() {
		var k string
		var c int
		if err := rows.Scan(&k, &c); err != nil {
			t.Fatal(err)
		}
		effects[k] = c
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	for id := range runs {
		for _, task := range []string{"score/-1", "enrich/0", "enrich/1", "notify/-1"} {
			if k := "process_customer/" + id + "/" + task; effects[k] != 1 {
				t.Errorf("task %s has %d effects in task_results, want 1", k, effects[k])
			}
		}
	}
	if len(effects) != 4*n {
		t.Errorf("%d task keys in task_results, want %d", len(effects), 4*n)
	}
	t.Logf("%d runs, killed task %s retried (%d calls), cleared %s replayed (%d calls)", len(runs), victimKey, len(vc), clearedKey, len(cc))
}
