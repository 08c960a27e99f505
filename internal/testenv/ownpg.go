package testenv

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"testing"
)

// OwnPostgres is a PostgreSQL cluster of a test's own (initdb into a temporary directory, a
// free port on 127.0.0.1, trust authentication), for tests that change cluster-wide settings
// or restart the server: never the shared dev cluster. wal_level=logical is set.
type OwnPostgres struct {
	// URL connects to database postgres as superuser postgres.
	URL       string
	Port      int
	dir, bin  string
	log       string
	asPostgre bool
}

// StartOwnPostgres initdbs and starts a cluster with conf appended to postgresql.conf (lines
// "name = value"); it is stopped (immediate) and removed when the test ends. It stops the test
// (see Unavailable) when initdb or pg_ctl is missing. As root it runs the server as the
// postgres OS user, under /var/tmp.
func StartOwnPostgres(t testing.TB, conf string) *OwnPostgres {
	t.Helper()
	FullTier(t, "initdbs and starts a PostgreSQL cluster of its own")
	bin := os.Getenv("PG_BIN")
	if bin == "" {
		if p, err := exec.LookPath("initdb"); err == nil {
			if real, err := filepath.EvalSymlinks(p); err == nil {
				p = real // the server's own bin directory, which has pg_basebackup too
			}
			bin = filepath.Dir(p)
		} else if _, err := os.Stat("/usr/lib/postgresql/15/bin/initdb"); err == nil {
			bin = "/usr/lib/postgresql/15/bin"
		} else {
			Unavailable(t, "initdb not found (set PG_BIN)")
		}
	}
	o := &OwnPostgres{bin: bin, asPostgre: os.Geteuid() == 0}
	base := ""
	if o.asPostgre {
		if _, err := user.Lookup("postgres"); err != nil {
			Unavailable(t, "running as root without a postgres OS user to run initdb as")
		}
		d, err := os.MkdirTemp("/var/tmp", "kafkatx-ownpg-")
		if err != nil {
			t.Fatal(err)
		}
		base = d
		if out, err := exec.Command("chown", "postgres:postgres", d).CombinedOutput(); err != nil {
			t.Fatalf("chown %s: %v %s", d, err, out)
		}
	} else {
		base = t.TempDir()
	}
	o.dir, o.log = filepath.Join(base, "data"), filepath.Join(base, "server.log")
	if out, err := o.run("initdb", "-D", o.dir, "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C.UTF-8", "--no-sync"); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cfg := fmt.Sprintf("\nlisten_addresses = '127.0.0.1'\nport = %d\nunix_socket_directories = '%s'\nwal_level = logical\nmax_replication_slots = 4\nmax_wal_senders = 4\nfsync = off\n%s\n",
		port, base, conf)
	f, err := os.OpenFile(filepath.Join(o.dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteString(cfg)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = o.run("pg_ctl", "-D", o.dir, "-m", "immediate", "-w", "stop")
		_ = os.RemoveAll(base)
	})
	o.URL, o.Port = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port), port
	if out, err := o.run("pg_ctl", "-D", o.dir, "-l", filepath.Join(base, "server.log"), "-w", "-t", "60", "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(base, "server.log"))
		t.Fatalf("pg_ctl start: %v\n%s\n%s", err, out, log)
	}
	return o
}

// Restart stops the server in mode (immediate: a crash, no shutdown checkpoint; fast: a
// clean stop) and starts it again on the same port.
func (o *OwnPostgres) Restart(t testing.TB, mode string) {
	t.Helper()
	if out, err := o.run("pg_ctl", "-D", o.dir, "-l", o.log, "-m", mode, "-w", "-t", "60", "restart"); err != nil {
		t.Fatalf("pg_ctl restart -m %s: %v\n%s", mode, err, out)
	}
}

func (o *OwnPostgres) run(name string, args ...string) (string, error) {
	path := filepath.Join(o.bin, name)
	var cmd *exec.Cmd
	if o.asPostgre {
		cmd = exec.Command("runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	} else {
		cmd = exec.Command(path, args...)
	}
	cmd.Stdin = nil
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}
