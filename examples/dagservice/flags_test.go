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
	bin := filepath.Join(t.TempDir(), "dagservice")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	for args, want := range map[*[]string]string{
		&[]string{"--retention", "-1h"}:  "--retention -1h0m0s: a duration must not be negative",
		&[]string{"--task-delay", "-1s"}: "--task-delay -1s",
		&[]string{"--retention", "1s"}:   "--retention 1s: want 1m0s to 8760h0m0s",
		&[]string{"--addr"}:              "flag needs an argument",
	} {
		cmd := exec.Command(bin, *args...)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Errorf("dagservice %q: %v, want exit 2", *args, err)
			continue
		}
		if lines := strings.Split(strings.TrimSpace(errOut.String()), "\n"); len(lines) != 1 || out.Len() != 0 || !strings.Contains(lines[0], want) {
			t.Errorf("dagservice %q: want one line with %q, got stdout %q stderr %q", *args, want, out.String(), errOut.String())
		}
	}
}
