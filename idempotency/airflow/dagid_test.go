package airflow

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// A DAG id Airflow cannot hold, or one that would not stay one segment of the API's URL, is
// refused before any request: 'ü/../x' was resolved by url.JoinPath into /api/v2/dags/x/...
// (a fresh-eyes attack). Good ids, unicode letters included, are sent escaped.
func TestDAGIDsAreCheckedAndEscaped(t *testing.T) {
	var requests atomic.Int64
	var paths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		paths = append(paths, r.URL.EscapedPath())
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte(`{"dag_run_id":"x","state":"queued"}`))
	}))
	defer srv.Close()
	c, err := New(Config{BaseURL: srv.URL, MaxAttempts: 1, DAGState: DAGStateConfig{Interval: -1}}) // paths of creates only
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"ü/../x", "..", ".", "a/b", "a b", "", strings.Repeat("d", 251)} {
		if _, err := c.TriggerDAGRun(context.Background(), Trigger{DAGID: bad, Key: "k"}); err == nil {
			t.Errorf("DAG id %q accepted", bad)
		}
		if ValidateDAGID(bad) == nil {
			t.Errorf("ValidateDAGID(%q) = nil", bad)
		}
	}
	if _, err := c.TriggerDAGRun(context.Background(), Trigger{DAGID: "x", RunID: "../y"}); err == nil {
		t.Error(`run id "../y" accepted`)
	}
	if n := requests.Load(); n != 0 {
		t.Fatalf("%d requests sent for refused ids (%v)", n, paths)
	}
	for _, good := range []string{"orders_v2.daily-1", "bücher"} {
		if err := ValidateDAGID(good); err != nil {
			t.Errorf("ValidateDAGID(%q) = %v", good, err)
		}
	}
	if _, err := c.TriggerDAGRun(context.Background(), Trigger{DAGID: "bücher", Key: "k"}); err != nil {
		t.Fatal(err)
	}
	if len(paths) == 0 || paths[0] != "/api/v2/dags/b%C3%BCcher/dagRuns" {
		t.Fatalf("request paths %v, want /api/v2/dags/b%%C3%%BCcher/dagRuns first", paths)
	}
}
