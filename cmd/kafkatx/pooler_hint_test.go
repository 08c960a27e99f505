package main

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// Issue 48, defect 7: a refusal behind a transaction pooler names what the kafkatx command's
// user can pass (--session-database-url), never a library setting, and only flags the
// command accepts.
func TestPoolerRefusalNamesAcceptedFlags(t *testing.T) {
	t.Parallel()
	cli := buildCLI(t)
	pooled := testenv.ThroughPgBouncer(t, testenv.Database(t))
	out, err := exec.Command(cli, "migrate", "up", "--database-url", pooled).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() == 0 || !strings.Contains(string(out), "transaction pooler") {
		t.Fatalf("migrate up through PgBouncer: %v, want a non-zero exit naming the transaction pooler:\n%s", err, out)
	}
	if !strings.Contains(string(out), "--session-database-url") || strings.Contains(string(out), "SkipMigrations") {
		t.Errorf("the refusal does not name --session-database-url alone as the remedy:\n%s", out)
	}
	testenv.RequireOnlyAcceptedFlags(t, cli, string(out), "migrate", "up")
}
