package airflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// loadDAG is examples/dags/kafkatx_load.py: paused when Airflow first parses it, so its runs
// stay queued (nothing runs on the shared machine).
const loadDAG = "kafkatx_load"

// Against the repository's real Airflow 3.3.2: a paused DAG's create answers 200 and the run
// stays queued (apache/airflow#71381) — the client reads is_paused, posts and reports it under
// post, holds it under hold (nothing posted), and a DAG Airflow does not know answers 404 as an
// Unavailable wait. The DAG's pause state is left as found; the run created is deleted.
func TestRealAirflowPausedDAG(t *testing.T) {
	testenv.FullTier(t, "needs a real Apache Airflow (scripts/dev-services up airflow)")
	url, user, pwFile := os.Getenv("AIRFLOW_URL"), os.Getenv("AIRFLOW_USERNAME"), os.Getenv("AIRFLOW_PASSWORD_FILE")
	if url == "" || user == "" || pwFile == "" {
		testenv.Unavailable(t, "a real Airflow: AIRFLOW_URL, AIRFLOW_USERNAME and AIRFLOW_PASSWORD_FILE are unset (eval \"$(scripts/dev-services env)\")")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel) // after the deletes below (cleanups run last first)
	newClient := func(p PausedPolicy) *Client {
		c, err := New(Config{BaseURL: url, Username: user, PasswordFile: pwFile, RequestTimeout: 30 * time.Second, DAGState: DAGStateConfig{WhenPaused: p}})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	post, hold := newClient(PausedPost), newClient(PausedHold)
	api := func(method, path, body string) (int, []byte) {
		t.Helper()
		token, err := post.bearer(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		var b []byte
		if body != "" {
			b = []byte(body)
		}
		status, out, _, err := post.roundTrip(ctx, method, post.base.JoinPath(strings.Split(path, "/")...).String(), b, token, 64<<10, false)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		return status, out
	}

	// kafkatx_load starts paused; if someone unpaused it, pause it for the test and restore it.
	status, body := api(http.MethodGet, "api/v2/dags/"+loadDAG, "")
	var dag struct {
		IsPaused *bool `json:"is_paused"`
	}
	if status != 200 || json.Unmarshal(body, &dag) != nil || dag.IsPaused == nil {
		t.Fatalf("GET the DAG %s: %d %s (is examples/dags/kafkatx_load.py parsed?)", loadDAG, status, body)
	}
	if !*dag.IsPaused {
		if s, b := api(http.MethodPatch, "api/v2/dags/"+loadDAG, `{"is_paused": true}`); s != 200 {
			t.Fatalf("pause %s: %d %s", loadDAG, s, b)
		}
		t.Cleanup(func() { api(http.MethodPatch, "api/v2/dags/"+loadDAG, `{"is_paused": false}`) })
	}

	key := fmt.Sprintf("paused-%d-%d", time.Now().UnixNano(), rand.Int64())
	// hold: nothing is posted.
	res, err := hold.TriggerDAGRun(ctx, Trigger{DAGID: loadDAG, Key: key})
	if !IsPaused(err) || !IsUnavailable(err) || res.Attempts != 0 {
		t.Fatalf("hold on the paused %s: %+v, %v; want an Unavailable *PausedError, nothing sent", loadDAG, res, err)
	}
	runPath := "api/v2/dags/" + loadDAG + "/dagRuns/" + RunID("", key)
	if s, b := api(http.MethodGet, runPath, ""); s != http.StatusNotFound {
		t.Fatalf("after a hold the run exists: %d %s", s, b)
	}
	// post: created, reported paused, queued in Airflow.
	res, err = post.TriggerDAGRun(ctx, Trigger{DAGID: loadDAG, Key: key})
	if err != nil || !res.Created || !res.Paused {
		t.Fatalf("post on the paused %s: %+v, %v; want created and Paused", loadDAG, res, err)
	}
	t.Cleanup(func() { api(http.MethodDelete, runPath, "") })
	var run struct {
		State string `json:"state"`
	}
	if s, b := api(http.MethodGet, runPath, ""); s != 200 || json.Unmarshal(b, &run) != nil || run.State != "queued" {
		t.Fatalf("the run posted to the paused DAG: %d %s; want it queued", s, b)
	}
	if st := post.DAGStates(); len(st) != 1 || st[0].Status != DAGPaused {
		t.Fatalf("DAGStates %+v: want %s paused", st, loadDAG)
	}
	if n := post.ReadinessNote(); !strings.Contains(n, "DAG "+loadDAG+" is paused") {
		t.Fatalf("readiness note %q", n)
	}
	// A DAG Airflow does not know: the create's 404, Unavailable (the partition waits).
	_, err = post.TriggerDAGRun(ctx, Trigger{DAGID: "kafkatx_no_such_dag", Key: key})
	var se *StatusError
	if !IsUnavailable(err) || IsPaused(err) || !asStatus(err, &se) || se.StatusCode != 404 {
		t.Fatalf("a DAG Airflow does not know: %v; want the create's 404 as Unavailable", err)
	}
	if n := post.ReadinessNote(); !strings.Contains(n, "kafkatx_no_such_dag is not known") {
		t.Fatalf("readiness note %q: want the unknown DAG named", n)
	}
}

func asStatus(err error, se **StatusError) bool { return errors.As(err, se) }
