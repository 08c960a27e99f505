package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// refusingAirflow is a stand-in for an Airflow that refuses or half-does creates
// (apache/airflow#66779): a conf over 2,000 bytes but under 64 KiB answers 413 (a proxy's
// limit); a conf of 64 KiB or more answers an opaque 500 without creating the run; the run
// of event 4 is created and then answered 500. GET .../dagRuns/{id} reads a run.
type refusingAirflow struct {
	mu      sync.Mutex
	creates map[string]int
	byEvent map[int]string
}

func (f *refusingAirflow) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	if r.Method == http.MethodGet {
		if f.creates[parts[len(parts)-1]] > 0 {
			_, _ = io.WriteString(w, `{"state":"queued"}`)
			return
		}
		http.Error(w, `{"detail":"DagRun not found"}`, http.StatusNotFound)
		return
	}
	raw, _ := io.ReadAll(r.Body)
	var body struct {
		DAGRunID string          `json:"dag_run_id"`
		Conf     json.RawMessage `json:"conf"`
	}
	_ = json.Unmarshal(raw, &body)
	var c struct{ ID int }
	_ = json.Unmarshal(body.Conf, &c)
	switch {
	case len(body.Conf) >= 64<<10:
		http.Error(w, `{"detail":"Internal Server Error"}`, http.StatusInternalServerError)
		return
	case len(body.Conf) > 2000:
		http.Error(w, "<html>413 Request Entity Too Large</html>", http.StatusRequestEntityTooLarge)
		return
	case f.creates[body.DAGRunID] > 0:
		http.Error(w, `{"detail":"exists"}`, http.StatusConflict)
		return
	}
	f.creates[body.DAGRunID]++
	f.byEvent[c.ID] = body.DAGRunID
	if c.ID == 4 {
		http.Error(w, `{"detail":"Internal Server Error"}`, http.StatusInternalServerError)
		return
	}
	fmt.Fprintf(w, `{"dag_run_id":%q}`, body.DAGRunID)
}

func sized(i, n int) (key, value []byte) {
	key = fmt.Appendf(nil, `{"id":%d}`, i)
	value = fmt.Appendf(nil, `{"before":null,"after":{"id":%d,"status":"active","blob":%q},"source":{"connector":"postgresql","db":"app","schema":"public","table":"customers","lsn":%d,"txId":%d},"op":"c","ts_ms":1790000000000}`,
		i, strings.Repeat("x", n), 100000+i*64, 700+i)
	return key, value
}

// TestConfTooLargeIsDeadLetteredAndA500AfterCreateIsSettled: a conf Airflow answers 413 to,
// and one it answers an opaque 500 to, are dead-lettered at once with their size (no waiting,
// no attempts spent on retrying); a run created and answered 500 is settled by its run id:
// one run, no dead letter.
func TestConfTooLargeIsDeadLetteredAndA500AfterCreateIsSettled(t *testing.T) {
	t.Parallel()
	f := &refusingAirflow{creates: map[string]int{}, byEvent: map[int]string{}}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	e := newEnv(t, srv.URL)
	var kvs [][2][]byte
	for i, n := range []int{10, 70 << 10, 3000, 10} {
		k, v := sized(i+1, n)
		kvs = append(kvs, [2][]byte{k, v})
	}
	produceRaw(t, e.brokers, e.topic, kvs)
	sum := e.finish(t, 0, "--max-attempts", "5")
	if sum["dead_lettered"] != 2 || sum["runs_created"] != 2 {
		t.Fatalf("summary %v; want 2 dead letters, 2 runs", sum)
	}
	f.mu.Lock()
	if len(f.creates) != 2 || f.creates[f.byEvent[1]] != 1 || f.creates[f.byEvent[4]] != 1 {
		t.Errorf("creates %v by event %v; want one run each for events 1 and 4", f.creates, f.byEvent)
	}
	f.mu.Unlock()
	pool, err := pgxpool.New(context.Background(), e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	rows, err := pool.Query(context.Background(), "SELECT error_class, error_message, attempts FROM kafkatx.dead_letters ORDER BY error_message")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var class, msg string
		var attempts int
		if err := rows.Scan(&class, &msg, &attempts); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s %d %s", class, attempts, msg))
	}
	// Each names its size: the conf is the after row, 36 bytes around the blob.
	all := strings.Join(got, "\n")
	if len(got) != 2 || !strings.Contains(all, "answered 413 Content Too Large to a conf of 3036 bytes") ||
		!strings.Contains(all, fmt.Sprintf("answered 500 to every create of a conf of %d bytes", 70<<10+36)) ||
		!strings.HasPrefix(got[0], "permanent 1 ") || !strings.HasPrefix(got[1], "permanent 1 ") {
		t.Fatalf("dead letters:\n%s", strings.Join(got, "\n"))
	}
}
