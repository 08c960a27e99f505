package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// Issue 36: `make demo` (scripts/demo) prints what it verifies and nothing stray: no line
// ending in psql's column separator after the slot line, and in WAL mode no count of outbox
// rows (events never become rows there; the count would verify nothing).
func TestDemoPrintsNoStrayOutput(t *testing.T) {
	testenv.DatabaseURL(t) // the dev PostgreSQL must be up
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(root, "scripts", "demo"))
	cmd.Dir = root
	cmd.Env = os.Environ()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("scripts/demo: %v\n%s", err, out)
	}
	text := string(out)
	wal := strings.Contains(text, "outbox mode: wal")
	for _, line := range strings.Split(text, "\n") {
		if strings.HasSuffix(strings.TrimSpace(line), "|") {
			t.Errorf("a line ends in a stray column separator: %q", line)
		}
	}
	if wal && strings.Contains(text, "outbox_rows_not_yet_published") {
		t.Errorf("WAL mode prints a count of outbox rows, which verifies nothing there:\n%s", text)
	}
	if !wal && !strings.Contains(text, "outbox_rows_not_yet_published") {
		t.Errorf("table mode does not print the outbox rows not yet published:\n%s", text)
	}
	if !strings.Contains(text, `"dead_lettered":1`) {
		t.Errorf("the demo's summary does not show its one dead letter:\n%s", text)
	}
	t.Logf("demo output:\n%s", text)
}
