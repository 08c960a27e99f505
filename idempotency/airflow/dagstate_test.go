package airflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// pausableAirflow answers GET /api/v2/dags/{dag} with is_paused (404 while missing) and
// POST /api/v2/dags/{dag}/dagRuns as Airflow does: 200 first, 409 after, 404 while missing.
// A paused DAG's runs are created (Airflow answers 200) and stay queued.
type pausableAirflow struct {
	paused, missing atomic.Bool
	dagReads, posts atomic.Int64
	mu              sync.Mutex
	runs            map[string]bool
}

func (f *pausableAirflow) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	if r.Method == http.MethodGet && len(parts) == 4 {
		f.dagReads.Add(1)
		if f.missing.Load() {
			http.Error(w, `{"detail":"Dag with dag_id: 'd' not found"}`, http.StatusNotFound)
			return
		}
		fmt.Fprintf(w, `{"dag_id":%q,"is_paused":%t}`, parts[3], f.paused.Load())
		return
	}
	if r.Method != http.MethodPost || len(parts) != 5 {
		http.Error(w, "unexpected", http.StatusBadRequest)
		return
	}
	f.posts.Add(1)
	if f.missing.Load() {
		http.Error(w, `{"detail":"Dag with dag_id: 'd' not found"}`, http.StatusNotFound)
		return
	}
	var body struct {
		ID string `json:"dag_run_id"`
	}
	b, _ := io.ReadAll(r.Body)
	_ = json.Unmarshal(b, &body)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.runs[body.ID] {
		http.Error(w, `{"detail":"exists"}`, http.StatusConflict)
		return
	}
	f.runs[body.ID] = true
	fmt.Fprintf(w, `{"dag_run_id":%q,"state":"queued"}`, body.ID)
}

func newPausable(t *testing.T, cfg DAGStateConfig) (*pausableAirflow, *Client, *observer.ObservedLogs) {
	t.Helper()
	f := &pausableAirflow{runs: map[string]bool{}}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	core, logs := observer.New(zap.InfoLevel)
	c, err := New(Config{BaseURL: srv.URL, Logger: zap.New(core), DAGState: cfg, MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	return f, c, logs
}

// changeLines counts the log lines that report a DAG's state changing.
func changeLines(logs *observer.ObservedLogs) map[string]int {
	out := map[string]int{}
	for _, e := range logs.All() {
		for _, f := range e.Context {
			if f.Key == "status" && strings.Contains(e.Message, "DAG") {
				out[f.String]++
			}
		}
	}
	return out
}

// Under the default policy (post) a paused DAG's run is created and reported: Result.Paused,
// one warning, the gauge at 1, the posted counter, the readiness note. Flips back and forth
// log one line each; the state is read once per interval, not per event.
func TestPausedDAGIsPostedAndReported(t *testing.T) {
	reg := prometheus.NewRegistry()
	f, c, logs := newPausable(t, DAGStateConfig{Interval: time.Hour, Registerer: reg})
	f.paused.Store(true)
	ctx := context.Background()
	for i := range 50 {
		res, err := c.TriggerDAGRun(ctx, Trigger{DAGID: "d", Key: fmt.Sprint("k", i)})
		if err != nil || !res.Created || !res.Paused {
			t.Fatalf("trigger %d of a paused DAG under post: %+v, %v; want created and Paused", i, res, err)
		}
	}
	if got := f.dagReads.Load(); got != 1 {
		t.Fatalf("50 triggers read the DAG %d times, want 1 (cached for the interval)", got)
	}
	if got := testutil.ToFloat64(c.dags.paused.WithLabelValues("d")); got != 1 {
		t.Fatalf("kafkatx_airflow_dag_paused = %v, want 1", got)
	}
	if got := testutil.ToFloat64(c.dags.triggers.WithLabelValues("d", "posted")); got != 50 {
		t.Fatalf("posted to a paused DAG = %v, want 50", got)
	}
	if n := c.ReadinessNote(); !strings.Contains(n, "DAG d is paused") || !strings.Contains(n, "queued") {
		t.Fatalf("readiness note %q: want the paused DAG named", n)
	}
	if lines := changeLines(logs); lines["paused"] != 1 || len(lines) != 1 {
		t.Fatalf("log lines per status %v: want one for paused", lines)
	}

	// Unpaused, paused again, unpaused: one line per change. The cache is dropped by hand
	// here to read each change at once (the interval is an hour).
	for i, p := range []bool{false, true, false} {
		f.paused.Store(p)
		expire(c, "d")
		res, err := c.TriggerDAGRun(ctx, Trigger{DAGID: "d", Key: fmt.Sprint("flip", i)})
		if err != nil || res.Paused != p {
			t.Fatalf("flip %d (paused %t): %+v, %v", i, p, res, err)
		}
	}
	if lines := changeLines(logs); lines["paused"] != 2 || lines["active"] != 2 {
		t.Fatalf("log lines per status after three flips %v: want paused 2, active 2", lines)
	}
	if got := testutil.ToFloat64(c.dags.paused.WithLabelValues("d")); got != 0 {
		t.Fatalf("kafkatx_airflow_dag_paused after the unpause = %v, want 0", got)
	}
	if n := c.ReadinessNote(); n != "" {
		t.Fatalf("readiness note for an active DAG: %q, want none", n)
	}
	if _, err := testutil.GatherAndCount(reg, "kafkatx_airflow_dag_paused", "kafkatx_airflow_paused_triggers_total"); err != nil {
		t.Fatal(err)
	}
}

// expire makes dag's cached state due for a read.
func expire(c *Client, dag string) {
	c.dags.mu.Lock()
	if e := c.dags.m[dag]; e != nil {
		e.fresh = false
	}
	c.dags.mu.Unlock()
}

// The cache expires after its interval: a pause is noticed at the first trigger past it.
func TestDAGStateIsReadAgainAfterTheInterval(t *testing.T) {
	f, c, _ := newPausable(t, DAGStateConfig{Interval: 200 * time.Millisecond})
	ctx := context.Background()
	if res, err := c.TriggerDAGRun(ctx, Trigger{DAGID: "d", Key: "a"}); err != nil || res.Paused {
		t.Fatalf("active DAG: %+v, %v", res, err)
	}
	f.paused.Store(true)
	if res, err := c.TriggerDAGRun(ctx, Trigger{DAGID: "d", Key: "b"}); err != nil || res.Paused {
		t.Fatalf("within the interval the cached state holds: %+v, %v", res, err)
	}
	time.Sleep(250 * time.Millisecond)
	if res, err := c.TriggerDAGRun(ctx, Trigger{DAGID: "d", Key: "c"}); err != nil || !res.Paused {
		t.Fatalf("past the interval the pause is read: %+v, %v", res, err)
	}
	if got := f.dagReads.Load(); got != 2 {
		t.Fatalf("DAG reads = %d, want 2", got)
	}
}

// Under hold a paused DAG's trigger posts nothing and returns an Unavailable *PausedError (the
// consumer waits, no attempt spent); once the DAG is unpaused the run is posted.
func TestPausedDAGIsHeldUntilUnpaused(t *testing.T) {
	reg := prometheus.NewRegistry()
	f, c, logs := newPausable(t, DAGStateConfig{Interval: time.Hour, WhenPaused: PausedHold, Registerer: reg})
	f.paused.Store(true)
	ctx := context.Background()
	for i := range 5 {
		res, err := c.TriggerDAGRun(ctx, Trigger{DAGID: "d", Key: "held"})
		var ue interface{ Unavailable() bool }
		if !IsPaused(err) || !IsUnavailable(err) || !errors.As(err, &ue) || res.Created || res.Attempts != 0 {
			t.Fatalf("try %d of a held DAG: %+v, %v; want an Unavailable *PausedError and nothing sent", i, res, err)
		}
	}
	if f.posts.Load() != 0 || f.dagReads.Load() != 1 {
		t.Fatalf("held: %d creates, %d DAG reads; want 0 and 1", f.posts.Load(), f.dagReads.Load())
	}
	if got := testutil.ToFloat64(c.dags.triggers.WithLabelValues("d", "held")); got != 5 {
		t.Fatalf("held triggers = %v, want 5", got)
	}
	if n := c.ReadinessNote(); !strings.Contains(n, "held") {
		t.Fatalf("readiness note %q: want the hold named", n)
	}
	f.paused.Store(false)
	expire(c, "d")
	res, err := c.TriggerDAGRun(ctx, Trigger{DAGID: "d", Key: "held"})
	if err != nil || !res.Created || res.Paused {
		t.Fatalf("after the unpause: %+v, %v; want the run created", res, err)
	}
	if lines := changeLines(logs); lines["paused"] != 1 || lines["active"] != 1 {
		t.Fatalf("log lines per status %v: want paused 1, active 1", lines)
	}
}

// A DAG Airflow does not know keeps the behaviour of before: the create is sent and its 404 is
// Unavailable (never Permanent); the DAG is read again at each trigger, so once it is parsed —
// paused, as a new DAG starts — the next trigger sees the pause. A create answering 404 for a
// DAG read as known drops its state (deleted; re-created paused).
func TestMissingDAGWaitsAndIsReadAgain(t *testing.T) {
	f, c, _ := newPausable(t, DAGStateConfig{Interval: time.Hour, WhenPaused: PausedHold})
	f.missing.Store(true)
	ctx := context.Background()
	for i := range 3 {
		_, err := c.TriggerDAGRun(ctx, Trigger{DAGID: "d", Key: "k"})
		var se *StatusError
		if !IsUnavailable(err) || IsPaused(err) || !errors.As(err, &se) || se.StatusCode != 404 {
			t.Fatalf("try %d of a missing DAG: %v; want the create's 404 as Unavailable", i, err)
		}
	}
	if f.dagReads.Load() != 3 || f.posts.Load() != 3 {
		t.Fatalf("missing DAG: %d reads, %d creates; want 3 and 3", f.dagReads.Load(), f.posts.Load())
	}
	if n := c.ReadinessNote(); !strings.Contains(n, "not known") {
		t.Fatalf("readiness note %q: want the missing DAG named", n)
	}
	f.missing.Store(false)
	f.paused.Store(true) // parsed, paused as new DAGs are
	if _, err := c.TriggerDAGRun(ctx, Trigger{DAGID: "d", Key: "k"}); !IsPaused(err) {
		t.Fatalf("the DAG parsed paused: %v; want it held at once", err)
	}
	f.paused.Store(false)
	expire(c, "d")
	if _, err := c.TriggerDAGRun(ctx, Trigger{DAGID: "d", Key: "k"}); err != nil {
		t.Fatal(err)
	}
	// Deleted and re-created paused: the create's 404 drops the cached "active".
	f.missing.Store(true)
	if _, err := c.TriggerDAGRun(ctx, Trigger{DAGID: "d", Key: "k2"}); !IsUnavailable(err) {
		t.Fatalf("deleted DAG: %v", err)
	}
	f.missing.Store(false)
	f.paused.Store(true)
	if _, err := c.TriggerDAGRun(ctx, Trigger{DAGID: "d", Key: "k2"}); !IsPaused(err) {
		t.Fatalf("re-created paused after a 404: %v; want the pause read at once, not after the hour", err)
	}
}

// The state read costs no request per event: many concurrent triggers share one read, and
// the requests per event stay at one create each.
func TestDAGStateReadIsSharedByConcurrentTriggers(t *testing.T) {
	f, c, _ := newPausable(t, DAGStateConfig{})
	const n = 200
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.TriggerDAGRun(context.Background(), Trigger{DAGID: "d", Key: fmt.Sprint(i)}); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	reads, posts := f.dagReads.Load(), f.posts.Load()
	t.Logf("%d events: %d creates, %d DAG reads: %.3f requests per event", n, posts, reads, float64(posts+reads)/n)
	if reads != 1 || posts != n {
		t.Fatalf("%d events cost %d DAG reads and %d creates; want 1 read (default interval 30 s) and %d creates", n, reads, posts, n)
	}
}

// A far side that does not answer the read (a stand-in with POST only: 501, or 405) leaves the
// state unknown, posts as before, logs it once and reads again only after the interval.
func TestUnreadableDAGStateIsPostedAsBefore(t *testing.T) {
	var reads, posts atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			reads.Add(1)
			http.Error(w, "Unsupported method ('GET')", http.StatusNotImplemented)
			return
		}
		posts.Add(1)
		_, _ = io.WriteString(w, `{"state":"queued"}`)
	}))
	t.Cleanup(srv.Close)
	core, logs := observer.New(zap.InfoLevel)
	c, err := New(Config{BaseURL: srv.URL, Logger: zap.New(core), DAGState: DAGStateConfig{WhenPaused: PausedHold}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if res, err := c.TriggerDAGRun(context.Background(), Trigger{DAGID: "d", Key: fmt.Sprint(i)}); err != nil || !res.Created || res.Paused {
			t.Fatalf("trigger %d: %+v, %v", i, res, err)
		}
	}
	if reads.Load() != 1 || posts.Load() != 20 {
		t.Fatalf("%d reads, %d creates; want 1 and 20", reads.Load(), posts.Load())
	}
	if lines := changeLines(logs); lines["unknown"] != 1 {
		t.Fatalf("log lines %v: want one for the unreadable state", lines)
	}
	if s := c.DAGStates(); len(s) != 1 || s[0].Status != DAGUnknown || !strings.Contains(s[0].Error, "501") {
		t.Fatalf("DAGStates %+v: want d unknown with the 501", s)
	}
}

// Interval < 0 reads nothing: the client posts as it did before it read is_paused.
func TestDAGStateOff(t *testing.T) {
	f, c, _ := newPausable(t, DAGStateConfig{Interval: -1, WhenPaused: PausedHold})
	f.paused.Store(true)
	if res, err := c.TriggerDAGRun(context.Background(), Trigger{DAGID: "d", Key: "k"}); err != nil || !res.Created || res.Paused {
		t.Fatalf("%+v, %v", res, err)
	}
	if f.dagReads.Load() != 0 || c.ReadinessNote() != "" || len(c.DAGStates()) != 0 {
		t.Fatalf("reads %d with the state off", f.dagReads.Load())
	}
	if _, err := New(Config{BaseURL: "http://x", DAGState: DAGStateConfig{WhenPaused: "wait"}}); err == nil || !strings.Contains(err.Error(), `"wait"`) {
		t.Fatalf("an unknown policy: %v", err)
	}
}

// A DAG read feeds the adaptive limit nothing: its latency is not a create's, and a 5xx or 501
// to it (a stand-in without GET) is not Airflow overloaded. Measured in acceptance 15-lanes
// when it did: 151 runs/s instead of 423 against creates of 200 ms.
func TestDAGReadsDoNotMoveTheLimit(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "overloaded", http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	c, err := New(Config{BaseURL: srv.URL, DAGState: DAGStateConfig{Interval: time.Nanosecond}})
	if err != nil {
		t.Fatal(err)
	}
	start := c.cfg.Limiter.Limit()
	for range 20 {
		if s, err := c.dags.get(context.Background(), "d"); err != nil || s.Status != DAGUnknown {
			t.Fatalf("%+v, %v", s, err)
		}
	}
	if got := c.cfg.Limiter.Limit(); got != start {
		t.Fatalf("20 DAG reads answered 503 moved the limit from %d to %d", start, got)
	}
}
