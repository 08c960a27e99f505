package main

import (
	"bytes"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// start runs bin with args until the test ends and returns the task URL once it listens.
func start(t *testing.T, bin string, args ...string) (url string, stderr *bytes.Buffer) {
	t.Helper()
	addr := testenv.FreeAddr(t)
	stderr = &bytes.Buffer{}
	cmd := exec.Command(bin, append([]string{"--addr", addr}, args...)...)
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() })
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return "http://" + addr + "/tasks/score", stderr
		}
		if time.Now().After(deadline) {
			t.Fatalf("dagservice did not listen within 30s: %s", stderr)
		}
	}
}

// storeAndReplay: a keyed call answers 200, its repeat replays the same body.
func storeAndReplay(t *testing.T, url, key string) {
	t.Helper()
	r1 := call(t, url, key, `{"customer":1}`)
	if r1.status != http.StatusOK || r1.replayed != "" {
		t.Fatalf("first call: %+v, want 200", r1)
	}
	if r2 := call(t, url, key, `{"customer":1}`); r2.status != http.StatusOK || r2.replayed != "true" || r2.body != r1.body {
		t.Fatalf("repeat: %+v, want the first body replayed", r2)
	}
}

// Regression (issue 48, defects 2 and 7): with pgx's exec query mode (what PgBouncer needs)
// every keyed call answered 500 (the stored headers and the task's input, []byte into
// jsonb, reached PostgreSQL as bytea's hex text); behind PgBouncer the service exited telling
// the user to pass --session-database-url, which it did not take. Now: exec and
// simple_protocol store and replay; behind the dev PgBouncer alone it refuses naming only
// flags it accepts, and with --session-database-url it stores and replays.
func TestDagServiceQueryModesAndPgBouncer(t *testing.T) {
	t.Parallel()
	bin := testenv.BuildBinary(t, "dagservice")
	direct := testenv.Database(t)
	sep := "?"
	if strings.Contains(direct, "?") {
		sep = "&"
	}
	for _, mode := range []string{"exec", "simple_protocol"} {
		url, _ := start(t, bin, "--database-url", direct+sep+"default_query_exec_mode="+mode)
		storeAndReplay(t, url, "mode/"+mode)
	}

	pooled := testenv.ThroughPgBouncer(t, direct)
	out, err := exec.Command(bin, "--addr", testenv.FreeAddr(t), "--database-url", pooled).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "transaction pooler") {
		t.Fatalf("behind PgBouncer without --session-database-url: %v, want exit 1 naming the transaction pooler:\n%s", err, out)
	}
	if strings.Contains(string(out), "SkipMigrations") {
		t.Errorf("the refusal names a library setting the binary's user cannot set:\n%s", out)
	}
	testenv.RequireOnlyAcceptedFlags(t, bin, string(out))

	url, _ := start(t, bin, "--database-url", pooled, "--session-database-url", direct)
	storeAndReplay(t, url, "pgbouncer/1")
}
