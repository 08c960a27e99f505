package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

type reply struct {
	status   int
	replayed string
	body     string
}

func call(t *testing.T, url, key, body string) reply {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), string(b)}
}

// TestDagService runs the binary as an Airflow task would call it: replay, 422, 400, and 409
// while the first call is still running; each key's result is written once.
func TestDagService(t *testing.T) {
	t.Parallel()
	dbURL := testenv.Database(t)
	bin := filepath.Join(t.TempDir(), "dagservice")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(bin, "--addr", addr, "--database-url", dbURL, "--task-delay", "500ms")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() })
	url := "http://" + addr + "/tasks/score"
	for deadline := time.Now().Add(120 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("dagservice did not listen within 120s")
		}
	}

	first := make(chan reply, 1)
	go func() { first <- call(t, url, "process_customer/r1/score/-1", `{"customer":1}`) }()
	time.Sleep(200 * time.Millisecond)
	if r := call(t, url, "process_customer/r1/score/-1", `{"customer":1}`); r.status != http.StatusConflict {
		t.Errorf("repeat while running: %d, want 409", r.status)
	}
	r1 := <-first
	if r1.status != 200 || r1.replayed != "" || !strings.Contains(r1.body, `"task":"score"`) {
		t.Fatalf("first: %+v", r1)
	}
	if r := call(t, url, "process_customer/r1/score/-1", `{"customer":1}`); r.status != 200 || r.replayed != "true" || r.body != r1.body {
		t.Errorf("repeat: %+v; want the first body replayed", r)
	}
	if r := call(t, url, "process_customer/r1/score/-1", `{"customer":2}`); r.status != http.StatusUnprocessableEntity {
		t.Errorf("other body: %d, want 422", r.status)
	}
	if r := call(t, url, "", `{"customer":3}`); r.status != http.StatusBadRequest {
		t.Errorf("no key: %d, want 400", r.status)
	}
	if r := call(t, url, "process_customer/r1/score/0", `not json`); r.status != http.StatusBadRequest {
		t.Errorf("bad JSON: %d, want 400", r.status)
	}
	// A call its client gives up on (a task killed during the call): nothing is stored, the
	// retry runs the task and gets its JSON result, not an empty replay.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"customer":9}`))
	req.Header.Set("Idempotency-Key", "process_customer/r9/score/-1")
	if _, err := http.DefaultClient.Do(req); err == nil {
		t.Error("the cancelled call answered")
	}
	cancel()
	var r9 reply
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if r9 = call(t, url, "process_customer/r9/score/-1", `{"customer":9}`); r9.status != http.StatusConflict {
			break
		}
	}
	if r9.status != 200 || r9.replayed != "" || !strings.Contains(r9.body, `"task":"score"`) {
		t.Errorf("retry after a cancelled call: %+v; want a fresh 200 with the task's JSON", r9)
	}

	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM task_results WHERE idempotency_key = 'process_customer/r1/score/-1'").Scan(&n); err != nil || n != 1 {
		t.Fatalf("task_results rows for the key: %d, %v; want 1", n, err)
	}
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM task_results WHERE idempotency_key = 'process_customer/r9/score/-1'").Scan(&n); err != nil || n != 1 {
		t.Fatalf("task_results rows for the cancelled key: %d, %v; want 1", n, err)
	}
}
