package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// fakeAirflow implements Airflow 3's POST /api/v2/dags/{dag_id}/dagRuns contract: the first
// create of a dag_run_id succeeds, a later one gets 409 Conflict. onCreate, when set, runs
// after a run is recorded and before the answer is sent (to kill the caller in between).
type fakeAirflow struct {
	mu        sync.Mutex
	delay     time.Duration
	runs      map[string]json.RawMessage // dag_run_id → conf
	creates   map[string]int             // dag_run_id → successful creates
	posts     int
	conflicts int
	bad       int
	onCreate  func(n int)
	// notFoundUntil: until then every post gets Airflow's 404 for a DAG not parsed yet.
	notFoundUntil time.Time
	notFound      int
	// pausedUntil: until then GET /api/v2/dags/process_customer answers is_paused true
	// (dagReads counts those reads; a paused DAG's runs are still created, as Airflow does).
	pausedUntil time.Time
	dagReads    int
}

func newFake(t *testing.T, delay time.Duration) (*fakeAirflow, string) {
	f := &fakeAirflow{delay: delay, runs: map[string]json.RawMessage{}, creates: map[string]int{}}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv.URL
}

func (f *fakeAirflow) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	time.Sleep(f.delay)
	if r.Method == http.MethodGet && r.URL.Path == "/api/v2/dags/process_customer" {
		f.mu.Lock()
		f.dagReads++
		missing, paused := time.Now().Before(f.notFoundUntil), time.Now().Before(f.pausedUntil)
		f.mu.Unlock()
		if missing {
			http.Error(w, `{"detail":"Dag with dag_id: 'process_customer' not found"}`, http.StatusNotFound)
			return
		}
		fmt.Fprintf(w, `{"dag_id":"process_customer","is_paused":%t}`, paused)
		return
	}
	raw, _ := io.ReadAll(r.Body)
	var body struct {
		DAGRunID    string          `json:"dag_run_id"`
		LogicalDate *string         `json:"logical_date"`
		Conf        json.RawMessage `json:"conf"`
	}
	f.mu.Lock()
	f.posts++
	if time.Now().Before(f.notFoundUntil) {
		f.notFound++
		f.mu.Unlock()
		http.Error(w, `{"detail":"Dag with dag_id: 'process_customer' not found"}`, http.StatusNotFound)
		return
	}
	if r.URL.Path != "/api/v2/dags/process_customer/dagRuns" || r.ContentLength <= 0 || len(r.TransferEncoding) > 0 ||
		r.Header.Get("Authorization") != "" || json.Unmarshal(raw, &body) != nil || body.DAGRunID == "" {
		f.bad++
		f.mu.Unlock()
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	if _, ok := f.runs[body.DAGRunID]; ok {
		f.conflicts++
		f.mu.Unlock()
		http.Error(w, `{"detail":"exists"}`, http.StatusConflict)
		return
	}
	f.runs[body.DAGRunID] = body.Conf
	f.creates[body.DAGRunID]++
	n := len(f.runs)
	hook := f.onCreate
	f.mu.Unlock()
	if hook != nil {
		hook(n)
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"dag_run_id":%q,"state":"queued"}`, body.DAGRunID)
}

// check asserts exactly one created run per event id in [1, n] with conf = the after row.
func (f *fakeAirflow) check(t *testing.T, n int) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.bad != 0 {
		t.Errorf("%d malformed requests", f.bad)
	}
	seen := map[int]int{}
	for id, conf := range f.runs {
		var c struct {
			ID     int    `json:"id"`
			Status string `json:"status"`
		}
		if err := json.Unmarshal(conf, &c); err != nil || c.Status != "active" {
			t.Errorf("run %s: conf %s is not the after row", id, conf)
		}
		seen[c.ID]++
		if f.creates[id] != 1 {
			t.Errorf("run %s created %d times", id, f.creates[id])
		}
	}
	if len(f.runs) != n || len(seen) != n {
		t.Errorf("%d runs for %d distinct events, want %d", len(f.runs), len(seen), n)
	}
	for i := 1; i <= n; i++ {
		if seen[i] != 1 {
			t.Errorf("event %d has %d runs", i, seen[i])
		}
	}
}

type env struct {
	bin, brokers, dbURL, topic, group, airflowURL, logDir string
}

// buildBinary returns this command built once for every test of the package (testenv.BuildOnce).
func buildBinary(t *testing.T) string {
	t.Helper()
	return testenv.BuildOnce(t, ".", "dagtrigger")
}

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.RemoveBuilds()
	os.Exit(code)
}

func newEnv(t *testing.T, airflowURL string) *env {
	brokers := testenv.Brokers(t)
	return &env{
		bin: buildBinary(t), brokers: brokers, dbURL: testenv.Database(t),
		topic: testenv.Topic(t, brokers, 3), group: testenv.Group(t), airflowURL: airflowURL, logDir: t.TempDir(),
	}
}

// command runs dagtrigger on the DAG process_customer, or on an asset when extra holds --asset.
func (e *env) command(extra ...string) *exec.Cmd {
	target := []string{"--dag-id", "process_customer"}
	if slices.Contains(extra, "--asset") || slices.Contains(extra, "--dag-id") {
		target = nil
	}
	args := append(append([]string{"--brokers", e.brokers, "--database-url", e.dbURL, "--topic", e.topic, "--group", e.group,
		"--airflow-url", e.airflowURL, "--instance-id", "test-dag-1", "--session-timeout", "10s"}, target...), extra...)
	return exec.Command(e.bin, args...)
}

func (e *env) start(t *testing.T, run int, extra ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := e.command(extra...)
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	logf, err := os.Create(filepath.Join(e.logDir, fmt.Sprintf("run-%d.log", run)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logf.Close() })
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return cmd, &stdout
}

// finish runs dagtrigger until idle and returns its summary line.
func (e *env) finish(t *testing.T, run int, extra ...string) map[string]int64 {
	t.Helper()
	cmd, stdout := e.start(t, run, append([]string{"--exit-when-idle", "4s"}, extra...)...)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			log, _ := os.ReadFile(filepath.Join(e.logDir, fmt.Sprintf("run-%d.log", run)))
			t.Fatalf("final run: %v\n%s", err, tail(log, 2000))
		}
	case <-time.After(3 * time.Minute):
		t.Fatal("final run did not go idle within 3 minutes")
	}
	var sum map[string]int64
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if len(lines) != 1 || json.Unmarshal([]byte(lines[0]), &sum) != nil {
		t.Fatalf("stdout is not one JSON summary line: %q", stdout.String())
	}
	return sum
}

// ledger returns the group's Airflow ledger: the outcomes recorded per run id (dag runs) or
// kafkatx_id (asset events).
func ledger(t *testing.T, e *env) map[string][]string {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	rows, err := pool.Query(context.Background(), `SELECT coalesce(run_id, kafkatx_id), outcome FROM kafkatx.airflow_ledger WHERE group_id = $1 ORDER BY id`, e.group)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string][]string{}
	for rows.Next() {
		var id, outcome string
		if err := rows.Scan(&id, &outcome); err != nil {
			t.Fatal(err)
		}
		out[id] = append(out[id], outcome)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// event is a Debezium-shaped change event (PostgreSQL connector, JSON without schemas).
func event(i int) (key, value []byte) {
	key = fmt.Appendf(nil, `{"id":%d}`, i)
	value = fmt.Appendf(nil, `{"before":null,"after":{"id":%d,"status":"active"},"source":{"connector":"postgresql","db":"app","schema":"public","table":"customers","lsn":%d,"txId":%d},"op":"c","ts_ms":1790000000000}`,
		i, 100000+i*64, 700+i)
	return key, value
}

func produce(t *testing.T, brokers, topic string, from, to int) {
	t.Helper()
	var kvs [][2][]byte
	for i := from; i <= to; i++ {
		k, v := event(i)
		kvs = append(kvs, [2][]byte{k, v})
	}
	produceRaw(t, brokers, topic, kvs)
}

func produceRaw(t *testing.T, brokers, topic string, kvs [][2][]byte) {
	t.Helper()
	p, err := kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": brokers, "enable.idempotence": true, "go.logs.channel.enable": false})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	deliveries := make(chan kafka.Event, len(kvs))
	for _, kv := range kvs {
		if err := p.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: kafka.PartitionAny}, Key: kv[0], Value: kv[1]}, deliveries); err != nil {
			t.Fatal(err)
		}
	}
	for range kvs {
		select {
		case ev := <-deliveries:
			if m, ok := ev.(*kafka.Message); !ok || m.TopicPartition.Error != nil {
				t.Fatalf("delivery: %v", ev)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("deliveries did not arrive within 30s")
		}
	}
}

// TestKillBetweenAirflowCallAndCommit: the fake Airflow SIGKILLs dagtrigger right after it
// created a run and before it answers, so the run exists while the consumer's transaction
// never commits. The restarted process posts the same run id again, gets 409, counts it as
// success: one run per event.
func TestKillBetweenAirflowCallAndCommit(t *testing.T) {
	t.Parallel()
	f, url := newFake(t, 0)
	e := newEnv(t, url)
	const n = 20
	produce(t, e.brokers, e.topic, 1, n)

	var mu sync.Mutex
	var victim *exec.Cmd
	killAt := map[int]bool{3: true, 11: true}
	f.mu.Lock() // ServeHTTP reads onCreate under f.mu
	f.onCreate = func(created int) {
		mu.Lock()
		defer mu.Unlock()
		if killAt[created] && victim != nil {
			_ = victim.Process.Signal(syscall.SIGKILL)
			delete(killAt, created)
		}
	}
	f.mu.Unlock()
	kills := 0
	for run := 0; run < 2; run++ {
		cmd, _ := e.start(t, run)
		mu.Lock()
		victim = cmd
		mu.Unlock()
		err := cmd.Wait()
		ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
		if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("run %d ended with %v, want the SIGKILL sent between the Airflow call and the commit", run, err)
		}
		kills++
	}
	mu.Lock()
	victim = nil
	mu.Unlock()
	sum := e.finish(t, 2)
	f.check(t, n)
	if f.conflicts < kills {
		t.Errorf("%d 409 answers after %d kills between create and commit; want at least one per kill", f.conflicts, kills)
	}
	if sum["dead_lettered"] != 0 {
		t.Errorf("summary %v: dead letters", sum)
	}
	// The ledger: one row per event, each run once, written only by committed transactions
	// (the killed ones left none); a run found existing (409) is recorded as existed.
	rows := ledger(t, e)
	existed := 0
	for id, outcomes := range rows {
		if len(outcomes) != 1 {
			t.Errorf("ledger holds run %s %d times (%v), want once", id, len(outcomes), outcomes)
		}
		if outcomes[0] == "existed" {
			existed++
		}
	}
	if len(rows) != n || existed < kills {
		t.Errorf("ledger: %d runs (%d existed), want %d runs and at least %d existed (one per kill)", len(rows), existed, n, kills)
	}
	t.Logf("runs=%d posts=%d conflicts=%d final summary %v", len(f.runs), f.posts, f.conflicts, sum)
}

// TestRandomKillsOneRunPerEvent: events arrive while dagtrigger is SIGKILLed at random
// moments and restarted; then a copy of some events is re-published at new offsets. Each
// event yields exactly one run, and the copies reach Airflow not at all.
func TestRandomKillsOneRunPerEvent(t *testing.T) {
	t.Parallel()
	f, url := newFake(t, 60*time.Millisecond)
	e := newEnv(t, url)
	const rounds, per = 6, 15
	kills := 0
	for r := 0; r < rounds; r++ {
		cmd, _ := e.start(t, r)
		produce(t, e.brokers, e.topic, r*per+1, r*per+per)
		time.Sleep(time.Duration(200+rand.IntN(1000)) * time.Millisecond)
		if cmd.ProcessState == nil && cmd.Process.Signal(syscall.SIGKILL) == nil {
			kills++
		}
		_ = cmd.Wait()
	}
	sum := e.finish(t, rounds)
	f.check(t, rounds*per)
	if kills < rounds/2 {
		t.Errorf("only %d of %d kills landed", kills, rounds)
	}
	t.Logf("kills=%d runs=%d posts=%d conflicts=%d final summary %v", kills, len(f.runs), f.posts, f.conflicts, sum)

	// Re-publish 10 processed events at new offsets (a connector restarted from an older
	// offset): skipped by their claimed source position, without calling Airflow.
	f.mu.Lock()
	postsBefore := f.posts
	f.mu.Unlock()
	produce(t, e.brokers, e.topic, 1, 10)
	sum = e.finish(t, rounds+1)
	f.mu.Lock()
	extra := f.posts - postsBefore
	f.mu.Unlock()
	if extra != 0 || sum["events_repeated"] != 10 || sum["processed"] != 10 {
		t.Errorf("re-published copies: %d Airflow calls, summary %v; want 0 calls, 10 processed, 10 repeated", extra, sum)
	}
	f.check(t, rounds*per)
}

// TestBadEventsDeadLettered: a value that is not a Debezium envelope, or lacks its source
// position, is dead-lettered (and published to <topic>.dlq by the in-process relay); a
// tombstone is skipped; the other events each get their run.
func TestBadEventsDeadLettered(t *testing.T) {
	t.Parallel()
	f, url := newFake(t, 0)
	e := newEnv(t, url)
	k1, v1 := event(1)
	k2, v2 := event(2)
	produceRaw(t, e.brokers, e.topic, [][2][]byte{
		{k1, v1},
		{[]byte(`{"id":9}`), []byte("not json \x00\xff")},
		{[]byte(`{"id":10}`), []byte(`{"after":{"id":10},"source":{"connector":"postgresql","txId":5},"op":"c"}`)},
		{k1, nil}, // tombstone
		{k2, v2},
	})
	sum := e.finish(t, 0)
	f.check(t, 2)
	if sum["dead_lettered"] != 2 || sum["tombstones"] != 1 || sum["runs_created"] != 2 {
		t.Fatalf("summary %v; want 2 dead letters, 1 tombstone, 2 runs", sum)
	}
	pool, err := pgxpool.New(context.Background(), e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var dl, pending int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM kafkatx.dead_letters WHERE error_class = 'permanent'").Scan(&dl); err != nil || dl != 2 {
		t.Fatalf("dead_letters: %d, %v; want 2", dl, err)
	}
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM kafkatx.outbox WHERE state = 'pending'").Scan(&pending); err != nil || pending != 0 {
		t.Fatalf("unpublished outbox rows at exit: %d, %v; want 0", pending, err)
	}
}

// TestDAGNotParsedYetWaitsInsteadOfDeadLettering: Airflow answers 404 for a DAG its
// dag-processor has not parsed yet (every 300 s by default). dagtrigger's partitions wait for it
// outside any transaction — no attempt, no dead letter — and --exit-when-idle does not fire while
// they wait, although it is much shorter than the wait.
func TestDAGNotParsedYetWaitsInsteadOfDeadLettering(t *testing.T) {
	t.Parallel()
	f, url := newFake(t, 0)
	e := newEnv(t, url)
	const n = 10
	produce(t, e.brokers, e.topic, 1, n)
	f.mu.Lock()
	f.notFoundUntil = time.Now().Add(15 * time.Second)
	f.mu.Unlock()
	cmd, stdout := e.start(t, 0, "--exit-when-idle", "1s", "--max-attempts", "2")
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
	notFound := f.notFound
	f.mu.Unlock()
	if notFound == 0 || sum["dead_lettered"] != 0 || sum["retries"] != 0 || sum["airflow_waits"] == 0 {
		t.Fatalf("404s %d, summary %v; want 404s waited out: no dead letter, no retry, airflow_waits > 0", notFound, sum)
	}
	log, _ := os.ReadFile(filepath.Join(e.logDir, "run-0.log"))
	if !bytes.Contains(log, []byte("dependency unavailable")) || bytes.Contains(log, []byte("retryable database error")) {
		t.Fatalf("log does not say the partition waited for Airflow:\n%s", tail(log, 2000))
	}
}
