package main

import (
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

// codeTable reads "N  meaning" (help) or "| N | meaning |" (README) lines into a map.
func codeTable(t *testing.T, re *regexp.Regexp, text string) map[int]string {
	t.Helper()
	out := map[int]string{}
	for _, m := range re.FindAllStringSubmatch(text, -1) {
		n, _ := strconv.Atoi(m[1])
		if _, dup := out[n]; dup {
			t.Fatalf("exit status %d listed twice", n)
		}
		out[n] = strings.TrimSpace(m[2])
	}
	return out
}

// Issue "a user's first week" 5 and 6: `kafkatx --help`, the README's exit-status table and
// the code's exit statuses list the same statuses, with the same command for each.
func TestHelpReadmeAndCodeAgreeOnExitStatuses(t *testing.T) {
	t.Parallel()
	code := map[int]string{0: "success", exitFailed: "error", exitUsage: "usage error", offsetsExitDrift: "offsets status",
		offsetsExitGap: "offsets account", offsetsExitActive: "offsets reset", exitNotActionable: "outbox release", offsetsExitUnknown: "offsets status", offsetsExitStalled: "offsets status", offsetsExitLogChanged: "offsets status"}
	help := codeTable(t, regexp.MustCompile(`(?m)^  (\d+)  (.+)$`), exitCodes)
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	sec := string(readme)
	i := strings.Index(sec, "| Status | Meaning |")
	if i < 0 {
		t.Fatal("README.md has no exit-status table (| Status | Meaning |)")
	}
	sec = sec[i:]
	if j := strings.Index(sec, "\n\n"); j >= 0 {
		sec = sec[:j]
	}
	doc := codeTable(t, regexp.MustCompile(`(?m)^\| (\d+) \| (.+) \|$`), sec)
	for n, word := range code {
		h, inHelp := help[n]
		r, inReadme := doc[n]
		if !inHelp || !inReadme {
			t.Errorf("exit status %d (%s): in --help %v, in the README %v", n, word, inHelp, inReadme)
			continue
		}
		if !strings.Contains(h, word) || !strings.Contains(strings.ReplaceAll(r, "`", ""), word) {
			t.Errorf("exit status %d: --help says %q, README %q; both should name %q", n, h, r, word)
		}
	}
	for n := range help {
		if _, ok := code[n]; !ok {
			t.Errorf("--help lists exit status %d, which no code path returns", n)
		}
	}
	for n := range doc {
		if _, ok := code[n]; !ok {
			t.Errorf("the README lists exit status %d, which no code path returns", n)
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
