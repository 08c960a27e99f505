package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

// kafkatx console: loopback by default; a token file too short to be a secret is a usage
// error (exit 2, one line); served, it answers 401 without the token and the partitions with
// it, refuses actions with --read-only, and stops on SIGTERM with status 0.
func TestConsoleCommand(t *testing.T) {
	t.Parallel()
	bin := buildCLI(t)
	help, _, code := runCLI(t, bin, "console", "--help")
	if code != 0 || !strings.Contains(help, "127.0.0.1:8089") || !strings.Contains(help, "--read-only") {
		t.Fatalf("console --help: exit %d\n%s", code, help)
	}
	dbURL, brokers := testenv.DatabaseURL(t), testenv.Brokers(t)
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	if err := kafkatx.Migrate(context.Background(), pool, schema); err != nil {
		t.Fatal(err)
	}
	tokFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokFile, []byte("short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	common := []string{"--database-url", dbURL, "--brokers", brokers, "--schema", schema, "console", "--token-file", tokFile}
	_, errOut, code := runCLI(t, bin, append(common, "--addr", testenv.FreeAddr(t))...)
	if code != 2 || strings.Count(strings.TrimRight(errOut, "\n"), "\n") != 0 || !strings.Contains(errOut, "at least 16") {
		t.Fatalf("a 5-byte token: exit %d, stderr %q: want 2 and one line", code, errOut)
	}
	tok := "0123456789abcdef-console-command"
	if err := os.WriteFile(tokFile, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, readOnly := range []bool{false, true} {
		addr := testenv.FreeAddr(t)
		args := append(common, "--addr", addr)
		if readOnly {
			args = append(args, "--read-only")
		}
		cmd := exec.Command(bin, args...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		get := func(method, path, token string) int {
			req, _ := http.NewRequest(method, "http://"+addr+path, strings.NewReader(`{"reason":"r"}`))
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return -1
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp.StatusCode
		}
		deadline := time.Now().Add(30 * time.Second)
		for get("GET", "/signin", "") != 200 {
			if time.Now().After(deadline) {
				_ = cmd.Process.Kill()
				t.Fatalf("console did not answer on %s: %s", addr, stderr.String())
			}
			time.Sleep(100 * time.Millisecond)
		}
		if c := get("GET", "/api/partitions", ""); c != 401 {
			t.Errorf("without the token: %d", c)
		}
		if c := get("GET", "/api/partitions", tok); c != 200 {
			t.Errorf("with the token: %d", c)
		}
		want := 404 // no such dead letter
		if readOnly {
			want = 403
		}
		if c := get("POST", "/api/dead-letters/1/discard", tok); c != want {
			t.Errorf("read-only %v: discard answered %d, want %d", readOnly, c, want)
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			t.Fatalf("console after SIGTERM: %v\n%s", err, stderr.String())
		}
		if strings.Contains(stderr.String(), tok) {
			t.Fatal("the console logged its token")
		}
	}
}
