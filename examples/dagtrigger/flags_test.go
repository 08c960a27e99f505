package main

import (
	"bytes"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Issue "a user's first week" 5: a bad value is refused with exit 2 and one line naming the
// flag and its range, before anything starts, instead of being replaced by a default.
func TestBadFlagValuesExit2WithOneLine(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "dagtrigger")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	for args, want := range map[*[]string]string{
		&[]string{"--brokers", "127.0.0.1:1", "--batch-size", "-5"}: "--batch-size -5: want 1 to 100,000",
		&[]string{"--max-attempts", "0"}:                            "--max-attempts 0: want 1 to 1,000",
		&[]string{"--exit-when-idle", "-3s"}:                        "--exit-when-idle -3s: a duration must not be negative",
		&[]string{"--airflow-timeout", "0s"}:                        "--airflow-timeout 0s: want 100ms to 10m0s",
		&[]string{"--airflow-wait-max", "-1m"}:                      "--airflow-wait-max -1m0s",
		&[]string{"--key-retention", "soon"}:                        "key-retention",
	} {
		cmd := exec.Command(bin, *args...)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Errorf("dagtrigger %q: %v, want exit 2", *args, err)
			continue
		}
		if lines := strings.Split(strings.TrimSpace(errOut.String()), "\n"); len(lines) != 1 || out.Len() != 0 || !strings.Contains(lines[0], want) {
			t.Errorf("dagtrigger %q: want one line with %q, got stdout %q stderr %q", *args, want, out.String(), errOut.String())
		}
	}
}
