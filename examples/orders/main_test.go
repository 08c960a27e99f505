package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Issue "liveness" 6: without a broker address the example ran on its in-process broker (said
// in one info line) and exited 0 having processed nothing from the real cluster. Now it
// refuses with exit 2 and one line, unless --in-process-broker asks for it.
func TestRefusesToRunWithoutABrokerUnlessAskedForTheInProcessOne(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "orders")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		args []string
		env  string
		want string // in the one line
	}{
		{args: []string{"--database-url", "postgres://nowhere/x"}, want: "--in-process-broker"},
		{args: []string{"--in-process-broker"}, env: "KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092", want: "--in-process-broker"},
		{args: []string{"--in-process-broker", "--generate", "-5"}, want: "--generate"},
		{args: []string{"--in-process-broker", "--max-outbox-rows", "-1"}, want: "--max-outbox-rows"},
		// Issue "a user's first week" 5: bad values were replaced by defaults.
		{args: []string{"--in-process-broker", "--batch-size", "-5"}, want: "--batch-size -5: want 1 to 100,000"},
		{args: []string{"--in-process-broker", "--max-attempts", "0"}, want: "--max-attempts 0: want 1 to 1,000"},
		{args: []string{"--in-process-broker", "--exit-when-idle", "-1s"}, want: "--exit-when-idle -1s: a duration must not be negative"},
		{args: []string{"--in-process-broker", "--session-timeout", "-2s"}, want: "--session-timeout"},
		{args: []string{"--in-process-broker", "--partitions", "0"}, want: "--partitions 0"},
		{args: []string{"--in-process-broker", "--batch-size", "lots"}, want: "batch-size"},
	} {
		cmd := exec.Command(bin, tc.args...)
		cmd.Env = append(os.Environ(), "KAFKA_BOOTSTRAP_SERVERS=", tc.env)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Fatalf("orders %q: %v, want exit 2", tc.args, err)
		}
		if lines := strings.Split(strings.TrimSpace(errOut.String()), "\n"); len(lines) != 1 || out.Len() != 0 || !strings.Contains(lines[0], tc.want) {
			t.Fatalf("orders %q: want one line naming %s, got stdout %q stderr %q", tc.args, tc.want, out.String(), errOut.String())
		}
	}
}
