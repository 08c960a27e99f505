package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

func TestWhenPausedFlagsAreChecked(t *testing.T) {
	t.Parallel()
	bin := testenv.BuildBinary(t, "dagtrigger")
	base := []string{"--topic", "t", "--group", "g", "--airflow-url", "http://127.0.0.1:1", "--dag-id", "d"}
	testenv.RequireUsageError(t, bin, append(base, "--when-paused", "wait"), nil, "--when-paused wait: want post or hold")
	testenv.RequireUsageError(t, bin, append(base, "--airflow-dag-state-interval", "0s"), nil, "--airflow-dag-state-interval 0s: want 1s to 1h0m0s")
}

// --when-paused hold: while Airflow reports the DAG paused nothing is posted and the
// partitions wait, spending no attempt (no retry, no dead letter: --max-attempts 2 would
// dead-letter at once otherwise); /readyz stays ready and notes the pause; the pause and the
// unpause are logged once each; once it is unpaused every event gets its one run. The DAG's
// state is read once per --airflow-dag-state-interval, not per event.
func TestWhenPausedHoldWaitsWithoutAttempts(t *testing.T) {
	f, url := newFake(t, 0)
	e := newEnv(t, url)
	const n = 30
	produce(t, e.brokers, e.topic, 1, n)
	f.mu.Lock()
	f.pausedUntil = time.Now().Add(time.Hour) // until the test unpauses it below
	f.mu.Unlock()
	addr := testenv.FreeAddr(t)
	start := time.Now()
	cmd, stdout := e.start(t, 0, "--when-paused", "hold", "--airflow-dag-state-interval", "1s",
		"--exit-when-idle", "2s", "--max-attempts", "2", "--metrics-addr", addr)
	// While paused: the DAG is read, nothing is posted, /readyz is 200 with the note and the
	// partitions waiting on the held runs.
	var ready string
	testenv.WaitFor(t, time.Minute, "a /readyz noting the paused DAG and partitions waiting on it", func() bool {
		code, body := testenv.Get(addr, "/readyz")
		ready = body
		return code == 200 && strings.Contains(body, "DAG process_customer is paused") && strings.Contains(body, "is paused (read paused since")
	}, func() string { return ready })
	time.Sleep(2 * time.Second) // tries go on while paused: still nothing may be posted
	f.mu.Lock()
	posts, reads := f.posts, f.dagReads
	f.pausedUntil = time.Now() // unpaused
	f.mu.Unlock()
	if posts != 0 || reads == 0 {
		t.Fatalf("while the DAG is paused under hold: %d creates, %d DAG reads; want none and some", posts, reads)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("dagtrigger: %v", err)
		}
	case <-time.After(3 * time.Minute):
		t.Fatal("dagtrigger did not exit within 3 minutes")
	}
	var sum map[string]int64
	if err := json.Unmarshal(bytes.TrimSpace(stdout.Bytes()), &sum); err != nil {
		t.Fatalf("summary %q: %v", stdout.String(), err)
	}
	f.check(t, n)
	f.mu.Lock()
	reads = f.dagReads
	f.mu.Unlock()
	took := time.Since(start)
	t.Logf("%d events, %d DAG reads in %s, summary %v", n, reads, took.Round(time.Second), sum)
	if sum["dead_lettered"] != 0 || sum["retries"] != 0 || sum["airflow_waits"] == 0 || sum["runs_created"] != n {
		t.Fatalf("summary %v: want %d runs, no dead letter, no retry, airflow_waits > 0", sum, n)
	}
	if max := int(took/time.Second) + 2; reads > max {
		t.Fatalf("%d DAG reads in %s with a 1 s interval: want at most %d (one per interval, not per event)", reads, took, max)
	}
	log, _ := os.ReadFile(filepath.Join(e.logDir, "run-0.log"))
	if c := bytes.Count(log, []byte("Airflow reports the DAG paused")); c != 1 {
		t.Fatalf("%d log lines for the pause, want 1:\n%s", c, tail(log, 3000))
	}
	if c := bytes.Count(log, []byte("Airflow reports the DAG unpaused")); c != 1 {
		t.Fatalf("%d log lines for the unpause, want 1:\n%s", c, tail(log, 3000))
	}
}

// --when-paused post (the default): a paused DAG's runs are created at once (Airflow queues
// them) and the pause is reported: a log line, the gauge, the readiness note.
func TestWhenPausedPostCreatesAndReports(t *testing.T) {
	f, url := newFake(t, 0)
	e := newEnv(t, url)
	const n = 20
	produce(t, e.brokers, e.topic, 1, n)
	f.mu.Lock()
	f.pausedUntil = time.Now().Add(time.Hour)
	f.mu.Unlock()
	addr := testenv.FreeAddr(t)
	cmd, stdout := e.start(t, 0, "--exit-when-idle", "6s", "--metrics-addr", addr)
	testenv.WaitFor(t, time.Minute, "every run created", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return len(f.runs) == n
	})
	code, metrics := testenv.Get(addr, "/metrics")
	if code != 200 || !strings.Contains(metrics, `kafkatx_airflow_dag_paused{dag_id="process_customer"} 1`) ||
		!strings.Contains(metrics, `kafkatx_airflow_paused_triggers_total{dag_id="process_customer",outcome="posted"} `+"20") {
		t.Fatalf("/metrics %d: want the DAG paused and 20 runs posted while paused:\n%s", code, metrics)
	}
	code, ready := testenv.Get(addr, "/readyz")
	if code != 200 || !strings.Contains(ready, "queued in Airflow until it is unpaused") {
		t.Fatalf("/readyz %d %s: want ready with the pause noted", code, ready)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("dagtrigger: %v", err)
	}
	var sum map[string]int64
	if err := json.Unmarshal(bytes.TrimSpace(stdout.Bytes()), &sum); err != nil || sum["runs_created"] != n || sum["airflow_waits"] != 0 {
		t.Fatalf("summary %q (%v): want %d runs created, no wait", stdout.String(), err, n)
	}
	f.check(t, n)
	log, _ := os.ReadFile(filepath.Join(e.logDir, "run-0.log"))
	if c := bytes.Count(log, []byte("Airflow reports the DAG paused: runs posted stay queued")); c != 1 {
		t.Fatalf("%d log lines for the pause, want 1:\n%s", c, tail(log, 3000))
	}
}
