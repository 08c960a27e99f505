package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The stand-in answers as Airflow does for what dagtrigger calls: a DAG read, the first create
// of a dag_run_id 200, a repeat 409 Conflict, a body without a run id 400, anything else 404.
func TestStandinAnswersAsAirflow(t *testing.T) {
	s := &standin{runs: map[string]struct{}{}}
	srv := httptest.NewServer(s)
	defer srv.Close()
	post := func(body string) int {
		resp, err := http.Post(srv.URL+"/api/v2/dags/bench/dagRuns", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := post(`{"dag_run_id":"r1","conf":{}}`); got != http.StatusOK {
		t.Fatalf("first create: %d, want 200", got)
	}
	if got := post(`{"dag_run_id":"r1","conf":{}}`); got != http.StatusConflict {
		t.Fatalf("repeat create: %d, want 409", got)
	}
	if got := post(`{"conf":{}}`); got != http.StatusBadRequest {
		t.Fatalf("no dag_run_id: %d, want 400", got)
	}
	resp, err := http.Get(srv.URL + "/api/v2/dags/bench")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("DAG read: %d, want 200", resp.StatusCode)
	}
	resp, err = http.Get(srv.URL + "/api/v2/assets")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("other path: %d, want 404", resp.StatusCode)
	}
	if s.created != 1 || s.conflicts != 1 || s.bad != 1 {
		t.Fatalf("counts created %d conflicts %d bad %d, want 1 1 1", s.created, s.conflicts, s.bad)
	}
}
