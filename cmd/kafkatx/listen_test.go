package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

// Issue "outages" 4: `kafkatx relay --health-addr` on a taken port and `console --addr
// nonsense` printed the listen error and then blamed the database ("this is the database's
// own condition (connection_lost)"). A listener that cannot bind is the command's failure
// (exit 1, naming the flag); an address that does not parse is a usage error (exit 2, one line
// naming the flag); neither mentions the database.
func TestListenErrorsAreTheCommandsOwn(t *testing.T) {
	t.Parallel()
	bin := buildCLI(t)
	db := testenv.DatabaseURL(t)
	brokers := testenv.Brokers(t)
	// A migrated schema of the test's own: the console checks its tables before it listens
	// (this test relied on the relay case's --migrate of the default schema, which a relay
	// that fails to listen first no longer does).
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	if _, err := migrations.Apply(context.Background(), pool, schema); err != nil {
		t.Fatal(err)
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("a-console-token-of-32-bytes-long"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--database-url", db, "--brokers", brokers, "relay", "--migrate", "--health-addr", taken.Addr().String()}, exitFailed, "--health-addr " + taken.Addr().String() + ": cannot listen"},
		{[]string{"--database-url", db, "--brokers", brokers, "relay", "--migrate", "--health-addr", "nonsense"}, exitUsage, "--health-addr nonsense: want HOST:PORT"},
		{[]string{"--database-url", db, "--migrate-never-mind"}, exitUsage, "--migrate-never-mind"},
		{[]string{"--database-url", db, "console", "--token-file", token, "--addr", "nonsense"}, exitUsage, "--addr nonsense: want HOST:PORT"},
		{[]string{"--database-url", db, "console", "--token-file", token, "--addr", "127.0.0.1:99999"}, exitUsage, "--addr 127.0.0.1:99999: the port must be a number from 0 to 65535"},
		{[]string{"--database-url", db, "console", "--token-file", token, "--addr", taken.Addr().String()}, exitFailed, "--addr " + taken.Addr().String() + ": cannot listen"},
		{[]string{"--database-url", db, "console", "--token-file", filepath.Join(t.TempDir(), "missing"), "--addr", "127.0.0.1:0"}, 0, ""},
	} {
		_, errOut, code := runCLI(t, bin, append([]string{"--schema", schema}, c.args...)...)
		if strings.Contains(errOut, "database's own condition") {
			t.Fatalf("kafkatx %q blames the database: %s", c.args, errOut)
		}
		if c.want == "" {
			if code == 0 {
				t.Fatalf("kafkatx %q: exit 0 with an unreadable file", c.args)
			}
			continue
		}
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Fatalf("kafkatx %q: exit %d, stderr %q; want %d naming %q", c.args, code, errOut, c.code, c.want)
		}
		if c.code == exitUsage && strings.Count(strings.TrimRight(errOut, "\n"), "\n") != 0 {
			t.Fatalf("kafkatx %q: a usage error in more than one line: %q", c.args, errOut)
		}
	}
}
