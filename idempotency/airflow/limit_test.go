package airflow

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kafkatx/kafkatx/limit"
)

// slowStandIn answers every create after delay (200, or 409 for a run it holds), counting the
// creates in flight; GET .../dagRuns/{id} reads a run (200 or 404) at once. hold, when set,
// delays the answer of a create that has already been recorded.
type slowStandIn struct {
	delay            time.Duration
	mu               sync.Mutex
	runs             map[string]bool
	posts, gets      int
	inflight, peak   atomic.Int64
	holdFirst        time.Duration // the first create is recorded, then answered after this
	statusAfterDelay int           // non-zero: answer every create with this status, recording none
}

func (s *slowStandIn) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && r.URL.Path == "/api/v2/dags/d" {
		_, _ = io.WriteString(w, `{"dag_id":"d","is_paused":false}`) // the client's read of is_paused
		return
	}
	if r.Method == http.MethodGet {
		s.mu.Lock()
		s.gets++
		found := s.runs[r.URL.Path[len("/api/v2/dags/d/dagRuns/"):]]
		s.mu.Unlock()
		if found {
			_, _ = io.WriteString(w, `{"state":"queued"}`)
			return
		}
		http.Error(w, `{"detail":"not found"}`, http.StatusNotFound)
		return
	}
	n := s.inflight.Add(1)
	defer s.inflight.Add(-1)
	for p := s.peak.Load(); n > p && !s.peak.CompareAndSwap(p, n); p = s.peak.Load() {
	}
	var body struct {
		DAGRunID string `json:"dag_run_id"`
	}
	b, _ := io.ReadAll(r.Body)
	_ = json.Unmarshal(b, &body)
	s.mu.Lock()
	s.posts++
	first := s.posts == 1
	exists := s.runs[body.DAGRunID]
	if s.statusAfterDelay == 0 {
		s.runs[body.DAGRunID] = true
	}
	s.mu.Unlock()
	if first && s.holdFirst > 0 {
		time.Sleep(s.holdFirst) // recorded, the answer late: the client's timeout passes
	}
	time.Sleep(s.delay)
	switch {
	case s.statusAfterDelay != 0:
		http.Error(w, `{"detail":"busy"}`, s.statusAfterDelay)
	case exists:
		http.Error(w, `{"detail":"exists"}`, http.StatusConflict)
	default:
		_, _ = io.WriteString(w, `{"state":"queued"}`)
	}
}

func newSlow(t *testing.T, s *slowStandIn, cfg Config) *Client {
	t.Helper()
	s.runs = map[string]bool{}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	cfg.BaseURL = srv.URL
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestPermitWaitDoesNotCountAgainstTheTimeout: 8 triggers at once through a limit of 2 against
// a far side answering in 150 ms, with a 300 ms request timeout: the last waits ~450 ms for
// its permit, longer than the timeout, and still succeeds with its first create — no
// timeout, no create sent twice, no run answered "already exists". Never more than 2 in flight.
func TestPermitWaitDoesNotCountAgainstTheTimeout(t *testing.T) {
	s := &slowStandIn{delay: 150 * time.Millisecond}
	c := newSlow(t, s, Config{RequestTimeout: 300 * time.Millisecond, Limiter: limit.Fixed(2), MaxAttempts: 3, InitialBackoff: time.Millisecond})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := c.TriggerDAGRun(context.Background(), Trigger{DAGID: "d", Key: fmt.Sprint("k", i)})
			if err == nil && (!res.Created || res.Attempts != 1) {
				err = fmt.Errorf("trigger %d: %+v, want created by its first attempt", i, res)
			}
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if s.posts != 8 || s.peak.Load() > 2 {
		t.Fatalf("%d creates sent (want 8), %d in flight at once (limit 2)", s.posts, s.peak.Load())
	}
}

// TestTimedOutCreateIsSettledByReadingTheRun: Airflow records the run but answers after the
// client's timeout; the client reads the run by its id before sending the create again,
// finds it, and succeeds without a second create (no "already exists").
func TestTimedOutCreateIsSettledByReadingTheRun(t *testing.T) {
	s := &slowStandIn{holdFirst: 400 * time.Millisecond}
	c := newSlow(t, s, Config{RequestTimeout: 100 * time.Millisecond, MaxAttempts: 3, InitialBackoff: time.Millisecond})
	res, err := c.TriggerDAGRun(context.Background(), Trigger{DAGID: "d", Key: "k"})
	if err != nil || !res.Created || !res.Settled || res.Attempts != 1 {
		t.Fatalf("%+v %v; want created, settled by the read, one attempt", res, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.posts != 1 || s.gets != 1 {
		t.Fatalf("%d creates, %d reads; want 1 and 1", s.posts, s.gets)
	}
}

// TestTimedOutCreateNotMadeIsSentAgain: a create that timed out before Airflow recorded it
// reads as absent (404) and is sent again.
func TestTimedOutCreateNotMadeIsSentAgain(t *testing.T) {
	var n atomic.Int64
	s := &slowStandIn{}
	inner := http.HandlerFunc(s.ServeHTTP)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && n.Add(1) == 1 {
			time.Sleep(300 * time.Millisecond) // lost before Airflow saw it
			return
		}
		inner(w, r)
	}))
	t.Cleanup(srv.Close)
	s.runs = map[string]bool{}
	c, err := New(Config{BaseURL: srv.URL, RequestTimeout: 100 * time.Millisecond, MaxAttempts: 3, InitialBackoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.TriggerDAGRun(context.Background(), Trigger{DAGID: "d", Key: "k"})
	if err != nil || !res.Created || res.Settled || res.Attempts != 2 {
		t.Fatalf("%+v %v; want created by the second attempt", res, err)
	}
	if s.gets != 1 || s.posts != 1 {
		t.Fatalf("%d reads, %d creates recorded; want 1 and 1", s.gets, s.posts)
	}
}

// TestOverloadAnswersShrinkTheLimit: 503s feed the limiter as dropped calls: the limit halves.
func TestOverloadAnswersShrinkTheLimit(t *testing.T) {
	l := limit.MustNew(limit.Config{Initial: 16})
	s := &slowStandIn{statusAfterDelay: http.StatusServiceUnavailable}
	c := newSlow(t, s, Config{Limiter: l, MaxAttempts: 2, InitialBackoff: time.Millisecond})
	if _, err := c.TriggerDAGRun(context.Background(), Trigger{DAGID: "d", Key: "k"}); !IsUnavailable(err) {
		t.Fatalf("%v, want unavailable", err)
	}
	if got := l.Limit(); got >= 16 {
		t.Fatalf("limit %d after 503s, want below 16", got)
	}
}

// keyedStandIn answers every create at once (200, or 409 for a run it holds), except a create
// whose run id starts with "bad": 503, with Retry-After when retryAfter is set. A read of a run
// answers 404.
type keyedStandIn struct {
	retryAfter bool
	mu         sync.Mutex
	runs       map[string]bool
	refused    int
}

func (s *keyedStandIn) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet { // the read that settles a 5xx: no such run
		http.Error(w, `{"detail":"not found"}`, http.StatusNotFound)
		return
	}
	var body struct {
		DAGRunID string `json:"dag_run_id"`
	}
	b, _ := io.ReadAll(r.Body)
	_ = json.Unmarshal(b, &body)
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(body.DAGRunID) >= 3 && body.DAGRunID[:3] == "bad" {
		s.refused++
		if s.retryAfter {
			w.Header().Set("Retry-After", "1")
		}
		http.Error(w, `{"detail":"Service Unavailable"}`, http.StatusServiceUnavailable)
		return
	}
	if s.runs[body.DAGRunID] {
		http.Error(w, `{"detail":"exists"}`, http.StatusConflict)
		return
	}
	s.runs[body.DAGRunID] = true
	_, _ = io.WriteString(w, `{"state":"queued"}`)
}

// TestOneKeysRefusalsDoNotShrinkTheLimit: Airflow answers 503 to one row's runs only, every
// time; 7 callers trigger other rows' runs while an eighth retries that row's run again and
// again, each trigger naming its row (limit.WithKey). The row's first refusal halves the limit;
// its next ones — dozens, in every window — do not: the limit ends at least where that first
// refusal left it. The same 503 with Retry-After (Airflow overloaded for everyone) halves it
// on every window: it is Airflow's, whatever the key.
func TestOneKeysRefusalsDoNotShrinkTheLimit(t *testing.T) {
	for _, retryAfter := range []bool{false, true} {
		t.Run(fmt.Sprint("retry-after=", retryAfter), func(t *testing.T) {
			// Tolerance 100: the latency of a busy test machine never shrinks the limit here;
			// only refusals do.
			l := limit.MustNew(limit.Config{Initial: 16, Max: 16, Tolerance: 100, ProbeFirst: -1, ProbeInterval: -1})
			s := &keyedStandIn{runs: map[string]bool{}, retryAfter: retryAfter}
			srv := httptest.NewServer(s)
			t.Cleanup(srv.Close)
			c, err := New(Config{BaseURL: srv.URL, Limiter: l, MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			row := func(id int) context.Context { return limit.WithKey(context.Background(), []byte(fmt.Sprint(id))) }
			// Row 7's first refusal, alone: 16 → 8.
			if _, err := c.TriggerDAGRun(row(7), Trigger{DAGID: "d", RunID: "bad-7-0"}); !IsUnavailable(err) {
				t.Fatalf("%v, want unavailable", err)
			}
			after := l.Limit()
			if !retryAfter && after != 8 {
				t.Fatalf("limit %d after the row's first refusal, want 16 halved (8)", after)
			}
			var wg sync.WaitGroup
			stop := make(chan struct{})
			var lowest atomic.Int64
			lowest.Store(int64(after))
			for w := range 7 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range 150 {
						id := 1000*(w+1) + i
						if _, err := c.TriggerDAGRun(row(id), Trigger{DAGID: "d", RunID: fmt.Sprint("ok-", id)}); err != nil {
							t.Error(err)
							return
						}
						if n := int64(l.Limit()); n < lowest.Load() {
							lowest.Store(n)
						}
					}
				}()
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 1; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					// Each of the row's events has a run of its own; the row is the key.
					_, _ = c.TriggerDAGRun(row(7), Trigger{DAGID: "d", RunID: fmt.Sprint("bad-7-", i)})
				}
			}()
			go func() {
				// The other rows' callers end after 150 runs each; then the refused row stops.
				for {
					s.mu.Lock()
					n := len(s.runs)
					s.mu.Unlock()
					if n >= 7*150 {
						close(stop)
						return
					}
					time.Sleep(time.Millisecond)
				}
			}()
			wg.Wait()
			s.mu.Lock()
			refused := s.refused
			s.mu.Unlock()
			if refused < 20 {
				t.Fatalf("the row was refused %d times, want it retried all along", refused)
			}
			if !retryAfter && lowest.Load() < int64(after) {
				t.Fatalf("limit fell to %d while one row was refused %d times (8 after its first refusal)", lowest.Load(), refused)
			}
			if retryAfter && lowest.Load() > 2 {
				t.Fatalf("limit never below %d while Airflow answered 503 with Retry-After %d times, want it shrunk", lowest.Load(), refused)
			}
			t.Logf("row refused %d times; lowest limit %d; last %d", refused, lowest.Load(), l.Limit())
		})
	}
}
