package testenv

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// OwnCluster starts a PostgreSQL cluster of the test's own — initdb into a temporary
// directory, a free TCP port on 127.0.0.1, trust authentication for the role "kafkatx" —
// with conf appended to postgresql.conf, for tests that change cluster-wide settings
// (synchronous_standby_names, ...) or stop the server, which must never touch the shared dev
// cluster. It returns the cluster's URL and data directory; the cluster is stopped (fast)
// when the test ends. initdb and pg_ctl come from PATH (or KAFKATX_PG_BIN); without them the
// test stops (see Unavailable).
func OwnCluster(t testing.TB, conf string) (url, dataDir string) {
	t.Helper()
	bin := func(name string) string {
		if dir := os.Getenv("KAFKATX_PG_BIN"); dir != "" {
			return filepath.Join(dir, name)
		}
		p, err := exec.LookPath(name)
		if err != nil {
			Unavailable(t, "%s not found on PATH (set KAFKATX_PG_BIN): a cluster of the test's own needs PostgreSQL's server binaries", name)
		}
		return p
	}
	initdb, pgctl := bin("initdb"), bin("pg_ctl")
	dir, err := os.MkdirTemp("", "kafkatx-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if os.Getenv("KAFKATX_KEEP_CLUSTER_LOG") != "" {
			log, _ := os.ReadFile(filepath.Join(dir, "log"))
			t.Logf("own cluster's log:\n%s", log)
		}
		os.RemoveAll(dir)
	})
	// PostgreSQL refuses to run as root: as root (a container), run it as the postgres user,
	// as scripts/dev-services does.
	command := exec.Command
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			Unavailable(t, "running as root and no postgres user to run a cluster of the test's own as: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
		command = func(name string, args ...string) *exec.Cmd {
			return exec.Command("runuser", append([]string{"-u", "postgres", "--", name}, args...)...)
		}
	}
	dataDir = filepath.Join(dir, "data")
	if out, err := command(initdb, "-D", dataDir, "-U", "kafkatx", "--auth=trust", "--no-sync", "-E", "UTF8").CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	settings := fmt.Sprintf("\nlisten_addresses = '127.0.0.1'\nport = %d\nunix_socket_directories = '%s'\nfsync = off\nmax_connections = 50\n%s\n", port, dir, conf)
	f, err := os.OpenFile(filepath.Join(dataDir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(settings); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if out, err := command(pgctl, "-D", dataDir, "-l", filepath.Join(dir, "log"), "-w", "-t", "60", "start").CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "log"))
		t.Fatalf("pg_ctl start: %v\n%s\n%s", err, out, log)
	}
	t.Cleanup(func() {
		_ = command(pgctl, "-D", dataDir, "-m", "immediate", "-w", "-t", "30", "stop").Run()
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("own cluster on port %d does not accept connections: %v", port, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Sprintf("postgres://kafkatx@127.0.0.1:%d/postgres?sslmode=disable", port), strings.TrimSpace(dataDir)
}
