package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestDatabaseURLPasswordNeverShown: a database URL whose password holds an unencoded '@',
// '#', '/' or '?' — from --database-url, --database-url-file or DATABASE_URL — is refused with
// the usage status (2: a bad value, refused before anything connects) and an error that shows
// no part of the password, for the relay and a read-only command alike.
func TestDatabaseURLPasswordNeverShown(t *testing.T) {
	bin := buildCLI(t)
	dir := t.TempDir()
	for i, pw := range []string{"ss#CANARY91@x", "p@ss#CANARY92", "p/CANARY93@x", "p?CANARY94@x"} {
		u := "postgres://kafkatx_dev:" + pw + "@127.0.0.1:1/nodb"
		file := filepath.Join(dir, "url"+string(rune('a'+i)))
		if err := os.WriteFile(file, []byte(u+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, way := range []struct {
			name string
			args []string
			env  []string
		}{
			{"flag", []string{"--database-url", u}, nil},
			{"file", []string{"--database-url-file", file}, nil},
			{"env", nil, []string{"DATABASE_URL=" + u}},
		} {
			for _, sub := range [][]string{{"offsets", "status", "--group", "g"}, {"relay"}} {
				cmd := exec.Command(bin, append(append([]string{"--brokers", "127.0.0.1:1"}, way.args...), sub...)...)
				cmd.Env = append(withoutEnv("DATABASE_URL", "KAFKATX_DATABASE_URL_FILE"), way.env...)
				out, err := cmd.CombinedOutput()
				if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != exitUsage {
					t.Errorf("%s %s %v: %v, want exit %d\n%s", pw, way.name, sub, err, exitUsage, out)
				}
				if strings.Contains(string(out), "CANARY9") || !strings.Contains(string(out), "percent-encode") {
					t.Errorf("%s %s %v: the output shows the password or no reason:\n%s", pw, way.name, sub, out)
				}
			}
		}
	}
}

// withoutEnv is os.Environ() without the named variables.
func withoutEnv(names ...string) []string {
	var env []string
next:
	for _, kv := range os.Environ() {
		for _, n := range names {
			if strings.HasPrefix(kv, n+"=") {
				continue next
			}
		}
		env = append(env, kv)
	}
	return env
}

// TestConditionHintOnUnreachableDatabase: a command that fails on the database's own condition
// (nothing listens) says so, and the password in the URL is not shown.
func TestConditionHintOnUnreachableDatabase(t *testing.T) {
	bin := buildCLI(t)
	_, errOut, code := runCLI(t, bin, "--brokers", "127.0.0.1:1", "--database-url", "postgres://u:CANARY95@127.0.0.1:1/db?connect_timeout=2", "offsets", "status", "--group", "g")
	if code != exitFailed || !strings.Contains(errOut, "database's own condition (connection_refused)") || strings.Contains(errOut, "CANARY") {
		t.Fatalf("exit %d, stderr:\n%s", code, errOut)
	}
}
