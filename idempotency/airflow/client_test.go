package airflow

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeAirflow implements the contract of Airflow 3's POST /api/v2/dags/{dag_id}/dagRuns:
// 200 on the first create of a dag_run_id, 409 Conflict after. fail, when set, answers
// instead of the endpoint for the n-th request (1-based) when it returns a status.
type fakeAirflow struct {
	mu       sync.Mutex
	runs     map[string]map[string]any // dag_run_id → body
	requests []*recorded
	fail     func(n int) (status int, retryAfter string)
	delay    time.Duration
}

type recorded struct {
	path          string
	auth          string
	hasAuth       bool
	contentLength int64
	chunked       bool
	contentType   string
	body          map[string]json.RawMessage
}

func newFake(t *testing.T) (*fakeAirflow, *httptest.Server) {
	f := &fakeAirflow{runs: map[string]map[string]any{}}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv
}

func (f *fakeAirflow) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet {
		// A read of a run (the client's settling after a 5xx): not a request the tests
		// count; the run exists when a create recorded it.
		parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
		f.mu.Lock()
		_, ok := f.runs[parts[len(parts)-1]]
		f.mu.Unlock()
		if ok {
			_, _ = io.WriteString(w, `{"state":"queued"}`)
			return
		}
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	b, _ := io.ReadAll(r.Body)
	rec := &recorded{
		path: r.URL.Path, auth: r.Header.Get("Authorization"), contentLength: r.ContentLength,
		chunked: len(r.TransferEncoding) > 0, contentType: r.Header.Get("Content-Type"),
	}
	_, rec.hasAuth = r.Header["Authorization"]
	_ = json.Unmarshal(b, &rec.body)
	f.mu.Lock()
	f.requests = append(f.requests, rec)
	n := len(f.requests)
	fail := f.fail
	f.mu.Unlock()
	if f.delay > 0 {
		time.Sleep(f.delay)
	}
	if fail != nil {
		if status, ra := fail(n); status != 0 {
			if ra != "" {
				w.Header().Set("Retry-After", ra)
			}
			http.Error(w, `{"detail":"injected"}`, status)
			return
		}
	}
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	if r.Method != http.MethodPost || len(parts) != 5 || parts[0] != "api" || parts[1] != "v2" || parts[2] != "dags" || parts[4] != "dagRuns" {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	var body map[string]any
	if err := json.Unmarshal(b, &body); err != nil {
		http.Error(w, "bad json", http.StatusBadRequest)
		return
	}
	id, _ := body["dag_run_id"].(string)
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.runs[id]; ok {
		http.Error(w, `{"detail":"DAG Run already exists"}`, http.StatusConflict)
		return
	}
	f.runs[id] = body
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"dag_run_id": id, "state": "queued"})
}

func (f *fakeAirflow) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.requests)
}

func fastConfig(url string) Config {
	// No read of the DAG's is_paused: these stand-ins count every request (dagstate_test.go reads it).
	return Config{BaseURL: url, InitialBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond, DAGState: DAGStateConfig{Interval: -1}}
}

func TestTriggerCreatesThenConflictIsSuccess(t *testing.T) {
	t.Parallel()
	f, srv := newFake(t)
	c, err := New(fastConfig(srv.URL + "/"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tr := Trigger{DAGID: "process_customer", Key: "pg::app.public.customers:c:100064:701", Conf: json.RawMessage(`{"id":1,"status":"active"}`)}
	r1, err := c.TriggerDAGRun(ctx, tr)
	if err != nil || !r1.Created || r1.Attempts != 1 {
		t.Fatalf("first: %+v %v", r1, err)
	}
	if r1.RunID != "kafkatx__pg::app.public.customers:c:100064:701" {
		t.Fatalf("run id %q", r1.RunID)
	}
	r2, err := c.TriggerDAGRun(ctx, tr)
	if err != nil || r2.Created || r2.RunID != r1.RunID {
		t.Fatalf("repeat: %+v %v; want success with Created=false", r2, err)
	}
	if len(f.runs) != 1 {
		t.Fatalf("%d runs", len(f.runs))
	}
	req := f.requests[0]
	if req.path != "/api/v2/dags/process_customer/dagRuns" {
		t.Fatalf("path %q", req.path)
	}
	if req.chunked || req.contentLength <= 0 || req.contentType != "application/json" {
		t.Fatalf("request framing: content-length %d chunked %v type %q", req.contentLength, req.chunked, req.contentType)
	}
	if string(req.body["logical_date"]) != "null" || string(req.body["conf"]) != `{"id":1,"status":"active"}` ||
		string(req.body["dag_run_id"]) != `"`+r1.RunID+`"` {
		t.Fatalf("body %v", req.body)
	}
	if req.hasAuth {
		t.Fatalf("Authorization sent without a token: %q", req.auth)
	}
}

func TestTokenFromFileReReadPerRequest(t *testing.T) {
	t.Parallel()
	f, srv := newFake(t)
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte("tok-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := fastConfig(srv.URL)
	cfg.TokenFile = file
	c, _ := New(cfg)
	if _, err := c.TriggerDAGRun(context.Background(), Trigger{DAGID: "d", Key: "a"}); err != nil {
		t.Fatal(err)
	}
	_ = os.WriteFile(file, []byte("tok-2"), 0o600)
	if _, err := c.TriggerDAGRun(context.Background(), Trigger{DAGID: "d", Key: "b"}); err != nil {
		t.Fatal(err)
	}
	if f.requests[0].auth != "Bearer tok-1" || f.requests[1].auth != "Bearer tok-2" {
		t.Fatalf("auth headers %q, %q", f.requests[0].auth, f.requests[1].auth)
	}
	if string(f.requests[0].body["conf"]) != "{}" {
		t.Fatalf("nil conf sent as %s, want {}", f.requests[0].body["conf"])
	}
}

func TestRetriesServerErrors(t *testing.T) {
	t.Parallel()
	f, srv := newFake(t)
	f.fail = func(n int) (int, string) {
		if n <= 2 {
			return []int{502, 503}[n-1], ""
		}
		return 0, ""
	}
	c, _ := New(fastConfig(srv.URL))
	r, err := c.TriggerDAGRun(context.Background(), Trigger{DAGID: "d", Key: "k"})
	if err != nil || !r.Created || r.Attempts != 3 {
		t.Fatalf("%+v %v; want created on the third attempt", r, err)
	}
}

// TestRetryAfterCreatedThenLostReply: the first attempt created the run but its answer was
// a 5xx (a proxy timed out): the client reads the run by its id, finds it, and succeeds
// without a second create (Settled).
func TestRetryAfterCreatedThenLostReply(t *testing.T) {
	t.Parallel()
	f, srv := newFake(t)
	c, _ := New(fastConfig(srv.URL))
	f.runs[RunID("", "k")] = map[string]any{} // created by the attempt whose reply was lost
	f.fail = func(n int) (int, string) {
		if n == 1 {
			return 504, ""
		}
		return 0, ""
	}
	r, err := c.TriggerDAGRun(context.Background(), Trigger{DAGID: "d", Key: "k"})
	if err != nil || !r.Created || !r.Settled || r.Attempts != 1 || len(f.requests) != 1 {
		t.Fatalf("%+v %v, %d creates sent", r, err, len(f.requests))
	}
}

func TestRetriesAreBounded(t *testing.T) {
	t.Parallel()
	f, srv := newFake(t)
	f.fail = func(int) (int, string) { return 503, "0" }
	cfg := fastConfig(srv.URL)
	cfg.MaxAttempts = 4
	c, _ := New(cfg)
	_, err := c.TriggerDAGRun(context.Background(), Trigger{DAGID: "d", Key: "k"})
	var se *StatusError
	if !errors.As(err, &se) || se.StatusCode != 503 || !strings.Contains(se.Detail, "injected") {
		t.Fatalf("err %v; want a 503 StatusError", err)
	}
	if n := f.count(); n != 4 {
		t.Fatalf("%d attempts, want MaxAttempts=4", n)
	}
}

func TestClientErrorsAreNotRetried(t *testing.T) {
	t.Parallel()
	for _, status := range []int{400, 403, 404, 422} {
		f, srv := newFake(t)
		f.fail = func(int) (int, string) { return status, "" }
		c, _ := New(fastConfig(srv.URL))
		_, err := c.TriggerDAGRun(context.Background(), Trigger{DAGID: "d", Key: "k"})
		var se *StatusError
		if !errors.As(err, &se) || se.StatusCode != status || se.Temporary() {
			t.Fatalf("%d: err %v", status, err)
		}
		if n := f.count(); n != 1 {
			t.Fatalf("%d: %d attempts, want 1", status, n)
		}
	}
}

func TestRetryAfterHonoured(t *testing.T) {
	t.Parallel()
	f, srv := newFake(t)
	f.fail = func(n int) (int, string) {
		if n == 1 {
			return 429, "1"
		}
		return 0, ""
	}
	cfg := fastConfig(srv.URL)
	cfg.MaxBackoff = 5 * time.Second
	c, _ := New(cfg)
	start := time.Now()
	if _, err := c.TriggerDAGRun(context.Background(), Trigger{DAGID: "d", Key: "k"}); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 900*time.Millisecond || d > 3*time.Second {
		t.Fatalf("retried after %v, want about Retry-After: 1s", d)
	}
}

func TestRequestTimeout(t *testing.T) {
	t.Parallel()
	f, srv := newFake(t)
	// The fake answers only long after every attempt's timeout: an answer that ends the call
	// can only be the client's own timeout. Attempts are the client's count (Result.Attempts):
	// the server may never see an attempt whose timeout passed before its request arrived (a
	// loaded machine), so its count proves nothing either way.
	f.delay = 3 * time.Second
	cfg := fastConfig(srv.URL)
	cfg.RequestTimeout = 50 * time.Millisecond
	cfg.MaxAttempts = 2
	c, _ := New(cfg)
	start := time.Now()
	res, err := c.TriggerDAGRun(context.Background(), Trigger{DAGID: "d", Key: "k"})
	if err == nil || time.Since(start) >= f.delay {
		t.Fatalf("err %v after %v; want a timeout before the server's answer at %v", err, time.Since(start), f.delay)
	}
	if res.Attempts != 2 {
		t.Fatalf("%d attempts, want 2 (MaxAttempts)", res.Attempts)
	}
}

func TestContextCancelStopsRetries(t *testing.T) {
	t.Parallel()
	f, srv := newFake(t)
	f.fail = func(int) (int, string) { return 503, "" }
	cfg := fastConfig(srv.URL)
	cfg.InitialBackoff, cfg.MaxBackoff, cfg.MaxAttempts = time.Second, time.Second, 10
	c, _ := New(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := c.TriggerDAGRun(ctx, Trigger{DAGID: "d", Key: "k"})
	if !errors.Is(err, context.DeadlineExceeded) || f.count() != 1 {
		t.Fatalf("err %v after %d attempts", err, f.count())
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"", "ftp://x", "http://user:pw@host", "not a url"} {
		if _, err := New(Config{BaseURL: u}); err == nil {
			t.Errorf("BaseURL %q accepted", u)
		}
	}
	c, _ := New(Config{BaseURL: "http://x"})
	if _, err := c.TriggerDAGRun(context.Background(), Trigger{DAGID: "d", Key: "k", Conf: []int{1}}); err == nil {
		t.Error("a conf that is not a JSON object was accepted")
	}
	if _, err := c.TriggerDAGRun(context.Background(), Trigger{DAGID: "d"}); err == nil {
		t.Error("a trigger without key or run id was accepted")
	}
}

func TestRunID(t *testing.T) {
	t.Parallel()
	if got := RunID("", "pg::app.public.customers:c:100064:701"); got != "kafkatx__pg::app.public.customers:c:100064:701" {
		t.Errorf("readable key: %q", got)
	}
	first, again := RunID("p_", "a/b"), RunID("p_", "a/b")
	if first != again || first == RunID("p_", "a/c") {
		t.Error("hashed run ids not deterministic or not distinct")
	}
	long := strings.Repeat("x", 300)
	for _, k := range []string{"a/b", "with space", "ключ", "a~b", long, ""} {
		id := RunID("", k)
		if !strings.HasPrefix(id, "kafkatx__~") || len(id) > MaxRunIDLength || !readable(strings.ReplaceAll(id, "~", "")) {
			t.Errorf("key %q: run id %q", k, id)
		}
	}
	// The hashed form of one key never equals the readable form of another.
	if RunID("", "x") == RunID("", "~"+strings.TrimPrefix(RunID("", "x"), "kafkatx__~")) {
		t.Error("collision between readable and hashed forms")
	}
}
