package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

// Issue "a user's first week" 5 and 6, issue 31: exit statuses live in one list
// (exitstatus.go). The README's table is exitStatusTable() exactly (KAFKATX_UPDATE_README=1
// rewrites it), `kafkatx --help` prints every status of the list, and every exit status a
// code path returns (exitError{code: ...}) is in the list.
func TestHelpReadmeAndCodeAgreeOnExitStatuses(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	sec := string(readme)
	i := strings.Index(sec, "| Status | Meaning |")
	if i < 0 {
		t.Fatal("README.md has no exit-status table (| Status | Meaning |)")
	}
	j := strings.Index(sec[i:], "\n\n")
	if j < 0 {
		j = len(sec) - i
	}
	if got, want := sec[i:i+j], exitStatusTable(); got != want {
		if os.Getenv("KAFKATX_UPDATE_README") != "" {
			if err := os.WriteFile("../../README.md", []byte(sec[:i]+want+sec[i+j:]), 0o644); err != nil {
				t.Fatal(err)
			}
		} else {
			t.Errorf("README.md's exit-status table is not exitStatusTable() (run with KAFKATX_UPDATE_README=1):\n%s\nwant\n%s", got, want)
		}
	}
	help, _, code := runCLI(t, buildCLI(t), "--help")
	if code != 0 {
		t.Fatalf("kafkatx --help exited %d", code)
	}
	listed := map[int]bool{}
	for _, s := range exitStatuses {
		if listed[s.code] {
			t.Errorf("exit status %d listed twice", s.code)
		}
		listed[s.code] = true
		if !regexp.MustCompile(`(?m)^\s+` + strconv.Itoa(s.code) + `\s+` + regexp.QuoteMeta(strings.Fields(s.help)[0])).MatchString(help) {
			t.Errorf("kafkatx --help does not list exit status %d (%s)", s.code, s.help)
		}
	}
	// Every status a code path returns is in the list.
	names := map[string]int{"exitOK": exitOK, "exitFailed": exitFailed, "exitUsage": exitUsage, "offsetsExitDrift": offsetsExitDrift,
		"offsetsExitGap": offsetsExitGap, "offsetsExitActive": offsetsExitActive, "exitNotActionable": exitNotActionable,
		"offsetsExitUnknown": offsetsExitUnknown, "offsetsExitStalled": offsetsExitStalled}
	files, _ := filepath.Glob("*.go")
	used := regexp.MustCompile(`(?:code:\s*|os\.Exit\()(\w+)`)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range used.FindAllStringSubmatch(string(src), -1) {
			n, ok := names[m[1]]
			if !ok {
				if v, err := strconv.Atoi(m[1]); err == nil {
					n, ok = v, true
				}
			}
			if ok && !listed[n] {
				t.Errorf("%s returns exit status %s, which exitStatuses does not list", f, m[1])
			}
		}
	}
	// docs/offsets.md once said usage errors exit 80.
	offsetsDoc, err := os.ReadFile("../../docs/offsets.md")
	if err != nil {
		t.Fatal(err)
	}
	if regexp.MustCompile(`(?i)usage errors?[^.]*\b80\b`).Match(offsetsDoc) {
		t.Error("docs/offsets.md still says usage errors exit 80 (they exit 2)")
	}
}

// Issue "a user's first week" 5: `offsets status` against an unreachable broker took 60 s and
// did not name it; `--output yaml` exited 1 instead of the usage status.
func TestUnreachableBrokerIsNamedWithinTheBoundAndBadOutputIsAUsageError(t *testing.T) {
	t.Parallel()
	bin := buildCLI(t)
	db := testenv.DatabaseURL(t)
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	if _, err := migrations.Apply(context.Background(), pool, schema); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, errOut, code := runCLI(t, bin, "--database-url", db, "--schema", schema, "--brokers", "127.0.0.1:1", "--kafka-timeout", "3s",
		"offsets", "status", "--group", "g", "--topic", "t")
	took := time.Since(start)
	if code != exitFailed || !strings.Contains(errOut, "no broker at 127.0.0.1:1 answered within 3s") || took > 8*time.Second {
		t.Fatalf("unreachable broker: exit %d after %v, stderr tail %q; want 1 within about 3 s naming 127.0.0.1:1", code, took, tailString(errOut, 300))
	}
	for _, args := range [][]string{
		{"offsets", "status", "--group", "g", "--output", "yaml"},
		{"offsets", "audit", "--group", "g", "--output", "yaml"},
		{"--kafka-timeout", "-1s", "offsets", "status", "--group", "g"},
		{"relay", "--exit-when-idle=-3s"},
		{"relay", "--batch-size", "0"},
		{"dlq", "list", "--limit", "0"},
		{"offsets", "reset", "--group", "g", "--topic", "t", "--to-offset=-5", "--mode", "skip", "--reason", "x"},
		{"offsets", "account", "--group", "g", "--topic", "t", "--partition=-1"},
	} {
		out, errOut, code := runCLI(t, bin, append([]string{"--database-url", db, "--brokers", "127.0.0.1:1"}, args...)...)
		if code != exitUsage || out != "" || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("kafkatx %q: exit %d, want 2 with one line; stdout %q stderr %q", args, code, out, errOut)
		}
	}
}
