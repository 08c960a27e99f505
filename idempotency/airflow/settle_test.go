package airflow

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// standIn plays Airflow's create and read of a run: POST .../dagRuns creates (200, or 409 for
// a run that exists), GET .../dagRuns/{id} reads (200 or 404). answer, when set, decides a
// create's answer first: created=true records the run before answering status.
type standIn struct {
	mu      sync.Mutex
	runs    map[string]int // run id → creates
	posts   int
	gets    int
	answer  func(n int, confBytes int) (status int, created bool)
	lastGet string
}

func newStandIn(t *testing.T) (*standIn, *Client) {
	s := &standIn{runs: map[string]int{}}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	c, err := New(Config{BaseURL: srv.URL, MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
		DAGState: DAGStateConfig{Interval: -1}}) // the stand-in counts every request; dagstate_test.go reads is_paused
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

func (s *standIn) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	if r.Method == http.MethodGet && len(parts) == 6 {
		s.gets++
		s.lastGet = parts[5]
		if s.runs[parts[5]] > 0 {
			_, _ = io.WriteString(w, `{"state":"queued"}`)
			return
		}
		http.Error(w, `{"detail":"not found"}`, http.StatusNotFound)
		return
	}
	b, _ := io.ReadAll(r.Body)
	var body struct {
		DAGRunID string          `json:"dag_run_id"`
		Conf     json.RawMessage `json:"conf"`
	}
	_ = json.Unmarshal(b, &body)
	s.posts++
	if s.answer != nil {
		if status, created := s.answer(s.posts, len(body.Conf)); status != 0 {
			if created {
				s.runs[body.DAGRunID]++
			}
			http.Error(w, `{"detail":"Internal Server Error"}`, status)
			return
		}
	}
	if s.runs[body.DAGRunID] > 0 {
		http.Error(w, `{"detail":"exists"}`, http.StatusConflict)
		return
	}
	s.runs[body.DAGRunID]++
	_, _ = io.WriteString(w, `{"state":"queued"}`)
}

func bigConf(n int) map[string]string { return map[string]string{"blob": strings.Repeat("x", n)} }

// TestConfOverTheLimitIsNotSent: a conf over MaxConfBytes is refused before sending, with
// its size and the limit, and is not an *UnavailableError.
func TestConfOverTheLimitIsNotSent(t *testing.T) {
	s, c := newStandIn(t)
	c.cfg.MaxConfBytes = 1000
	_, err := c.TriggerDAGRun(context.Background(), Trigger{DAGID: "d", Key: "k", Conf: bigConf(2000)})
	var tl *ConfTooLargeError
	if !errors.As(err, &tl) || tl.Size != 2011 || tl.Limit != 1000 || tl.Status != 0 || IsUnavailable(err) ||
		!strings.Contains(err.Error(), "2011 bytes") || !strings.Contains(err.Error(), "limit 1000 bytes") {
		t.Fatalf("%v (%+v)", err, tl)
	}
	if s.posts != 0 {
		t.Fatalf("%d posts, want none", s.posts)
	}
	if _, err := c.TriggerDAGRun(context.Background(), Trigger{DAGID: "d", Key: "k2", Conf: bigConf(900)}); err != nil {
		t.Fatalf("a conf under the limit: %v", err)
	}
}

// TestAnswered413IsConfTooLarge: a 413 is a *ConfTooLargeError naming the size, sent once.
func TestAnswered413IsConfTooLarge(t *testing.T) {
	s, c := newStandIn(t)
	s.answer = func(int, int) (int, bool) { return http.StatusRequestEntityTooLarge, false }
	_, err := c.TriggerDAGRun(context.Background(), Trigger{DAGID: "d", Key: "k", Conf: bigConf(3000)})
	var tl *ConfTooLargeError
	if !errors.As(err, &tl) || tl.Status != 413 || tl.Size != 3011 || IsUnavailable(err) || s.posts != 1 {
		t.Fatalf("%v (%+v), %d posts", err, tl, s.posts)
	}
}

// TestFiveHundredAfterTheRunWasCreatedIsSettledByItsID: Airflow creates the run and answers
// 500; the client reads the run by its id, finds it and succeeds: one run, one create sent.
func TestFiveHundredAfterTheRunWasCreatedIsSettledByItsID(t *testing.T) {
	s, c := newStandIn(t)
	s.answer = func(n, _ int) (int, bool) {
		if n == 1 {
			return http.StatusInternalServerError, true
		}
		return 0, false
	}
	res, err := c.TriggerDAGRun(context.Background(), Trigger{DAGID: "d", Key: "k", Conf: map[string]int{"a": 1}})
	if err != nil || !res.Created || !res.Settled || res.Attempts != 1 {
		t.Fatalf("%+v %v", res, err)
	}
	if s.posts != 1 || s.gets != 1 || s.runs[res.RunID] != 1 || s.lastGet != res.RunID {
		t.Fatalf("posts %d gets %d runs %v", s.posts, s.gets, s.runs)
	}
}

// TestOpaque500ToALargeConf: 500 on every create while the run reads as absent: with a conf
// of OpaqueConfBytes or more it is a *ConfTooLargeError (dead-lettered), below it Airflow
// failing (an *UnavailableError, waited out). Neither creates a run.
func TestOpaque500ToALargeConf(t *testing.T) {
	s, c := newStandIn(t)
	s.answer = func(int, int) (int, bool) { return http.StatusInternalServerError, false }
	_, err := c.TriggerDAGRun(context.Background(), Trigger{DAGID: "d", Key: "big", Conf: bigConf(OpaqueConfBytes)})
	var tl *ConfTooLargeError
	if !errors.As(err, &tl) || tl.Status != 500 || IsUnavailable(err) || !strings.Contains(err.Error(), "apache/airflow#66779") {
		t.Fatalf("large conf: %v", err)
	}
	_, err = c.TriggerDAGRun(context.Background(), Trigger{DAGID: "d", Key: "small", Conf: bigConf(10)})
	if !IsUnavailable(err) || IsConfTooLarge(err) {
		t.Fatalf("small conf: %v, want unavailable", err)
	}
	if len(s.runs) != 0 {
		t.Fatalf("runs created: %v", s.runs)
	}
}
