package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

func runCLI(t *testing.T, bin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errOut.String(), code
}

// Issue "liveness" 8: exit codes were undocumented, a usage error printed ~40 lines of help
// before the one useful line, an empty or odd --schema was accepted, and the hint echoed it
// unquoted into a suggested shell command.
func TestCLIUsageErrorsExitCodesAndSchemaNames(t *testing.T) {
	t.Parallel()
	bin := buildCLI(t)
	badProps := filepath.Join(t.TempDir(), "bad.properties")
	if err := os.WriteFile(badProps, []byte("sasl.password=s3cret\nsession.timeout.ms=s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"offsets", "reset", "--bogus"},
		{"nope"},
		{"--schema", "", "migrate", "print"},
		{"--schema", strings.Repeat("s", 64), "migrate", "print"},
		// A fresh-eyes attack: these reached the database or the broker before being refused.
		{"--database-url", "postgres://127.0.0.1:1/x", "dlq", "show", "0"},
		{"--database-url", "postgres://127.0.0.1:1/x", "dlq", "show", "--", "-1"},
		{"--database-url", "postgres://127.0.0.1:1/x", "--brokers", "127.0.0.1:1", "--security-protocol", "bogus", "relay"},
		// The same kind through -X and --kafka-config-file: librdkafka refused them when the
		// first client was made, exit 1 (a second fresh-eyes attack).
		{"--database-url", "postgres://127.0.0.1:1/x", "--brokers", "127.0.0.1:1", "-X", "security.protocol=bogus", "relay"},
		{"--database-url", "postgres://127.0.0.1:1/x", "--brokers", "127.0.0.1:1", "-X", "no.such.property=1", "offsets", "status", "--group", "g"},
		{"--database-url", "postgres://127.0.0.1:1/x", "--brokers", "127.0.0.1:1", "--kafka-config-file", badProps, "console"},
		{"--database-url-file", "/nonexistent/url", "dlq", "list"},
		{"--database-url", "postgres://127.0.0.1:1/x", "--brokers", "127.0.0.1:1", "--sasl-mechanism", "s3cret", "relay"},
		// Issue 48, F6: an empty --reason is a usage error here as in dlq and outbox; a
		// --database-url that does not parse is refused before anything connects (it was exit
		// 1), and the password is not shown.
		{"--database-url", "postgres://127.0.0.1:1/x", "--brokers", "127.0.0.1:1", "offsets", "reset", "--group", "g", "--topic", "t", "--to-latest", "--mode", "skip", "--reason", ""},
		{"--database-url", "postgres://127.0.0.1:1/x", "--brokers", "127.0.0.1:1", "offsets", "reset", "--group", "g", "--topic", "t", "--to-latest", "--mode", "skip", "--reason", "  "},
		{"--database-url", "postgres://u:s3cret@127.0.0.1:1/x?sslmode=bogus", "dlq", "list"},
		{"--database-url", "postgres://u:s3cret@127.0.0.1:1/x?default_query_exec_mode=bogus", "outbox", "parked"},
		{"--database-url", "postgres://u:s3cret@127.0.0.1:1/x?pool_max_conns=abc", "migrate", "up"},
		{"--database-url", "postgres://u:s3cret@[::1", "dlq", "list"},
		{"--database-url", "host=127.0.0.1 port=abc user=u password=s3cret", "offsets", "audit", "--group", "g"},
		{"--database-url", "postgres://127.0.0.1:1/x", "--session-database-url", "postgres://u:s3cret@127.0.0.1:1/x?sslmode=bogus", "migrate", "up"},
		// --shard: NAME=URL, a valid and unique name, a URL that parses, and the shards
		// commands without any.
		{"--database-url", "postgres://127.0.0.1:1/x", "--shard", "s1", "shards", "status"},
		{"--database-url", "postgres://127.0.0.1:1/x", "--shard", "=postgres://127.0.0.1:1/x", "shards", "status"},
		{"--database-url", "postgres://127.0.0.1:1/x", "--shard", "a=postgres://127.0.0.1:1/x", "--shard", "a=postgres://127.0.0.1:1/y", "shards", "status"},
		{"--database-url", "postgres://127.0.0.1:1/x", "--shard", "a=postgres://u:s3cret@127.0.0.1:1/x?sslmode=bogus", "migrate", "up"},
		{"--database-url", "postgres://127.0.0.1:1/x", "shards", "status"},
		{"--database-url", "postgres://127.0.0.1:1/x", "--shard", "a=postgres://127.0.0.1:1/x", "shards", "move", "--group", "g", "--topic", "t", "--partition", "0", "--to", "a", "--reason", " "},
	} {
		out, errOut, code := runCLI(t, bin, args...)
		if code != 2 {
			t.Fatalf("kafkatx %q: exit %d, want 2 (usage)", args, code)
		}
		if strings.Contains(errOut, "s3cret") {
			t.Fatalf("kafkatx %q: stderr shows a value of the config file: %q", args, errOut)
		}
		if lines := strings.Count(strings.TrimRight(errOut, "\n"), "\n") + 1; lines != 1 || out != "" || !strings.Contains(errOut, "--help") {
			t.Fatalf("kafkatx %q: want one line on stderr pointing to --help, got stdout %q stderr %q", args, out, errOut)
		}
	}
	help, _, code := runCLI(t, bin, "--help")
	if code != 0 {
		t.Fatalf("--help exit %d", code)
	}
	for _, want := range []string{"Exit status:", "2  usage error", "3  offsets status: drift", "6  outbox release|discard, dlq show|replay|discard, parked-keys release|dead-letter: no such row"} {
		if !strings.Contains(help, want) {
			t.Fatalf("--help does not document %q:\n%s", want, help)
		}
	}

	// A schema name with shell metacharacters is quoted in the suggested command.
	odd := "no such; rm -rf x"
	_, errOut, code := runCLI(t, bin, "--database-url", testenv.DatabaseURL(t), "--brokers", "127.0.0.1:1", "--schema", odd,
		"offsets", "status", "--group", "g")
	if code != 1 || !strings.Contains(errOut, "--schema 'no such; rm -rf x'") {
		t.Fatalf("exit %d, stderr %q: want the schema quoted in the hint", code, errOut)
	}
}
