package testenv

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// StartStandby makes a streaming standby of the running cluster o (pg_basebackup -R -X stream,
// asynchronous replication) on a free port of 127.0.0.1 and starts it; it is stopped
// (immediate) and removed when the test ends. Together with CutOff, Stop and Promote it stages
// a failover to a standby that asynchronous replication left behind.
func (o *OwnPostgres) StartStandby(t testing.TB) *OwnPostgres {
	t.Helper()
	return o.StartStandbyWith(t, "")
}

// StartStandbyWith is StartStandby with conf appended to the standby's postgresql.conf (after
// hot_standby = on, so "hot_standby = off" makes a standby that refuses every session with
// 57P03 until it is promoted).
func (o *OwnPostgres) StartStandbyWith(t testing.TB, conf string) *OwnPostgres {
	t.Helper()
	base := filepath.Dir(o.dir) + "-standby"
	if err := os.MkdirAll(base, 0o755); err != nil {
		t.Fatal(err)
	}
	s := &OwnPostgres{bin: o.bin, asPostgre: o.asPostgre, dir: filepath.Join(base, "data"), log: filepath.Join(base, "server.log")}
	if o.asPostgre {
		if out, err := exec.Command("chown", "postgres:postgres", base).CombinedOutput(); err != nil {
			t.Fatalf("chown %s: %v %s", base, err, out)
		}
	}
	t.Cleanup(func() {
		_, _ = s.run("pg_ctl", "-D", s.dir, "-m", "immediate", "-w", "stop")
		_ = os.RemoveAll(base)
	})
	if out, err := s.run("pg_basebackup", "-h", "127.0.0.1", "-p", fmt.Sprint(o.Port), "-U", "postgres", "-D", s.dir, "-R", "-X", "stream", "-c", "fast"); err != nil {
		t.Fatalf("pg_basebackup: %v\n%s", err, out)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.Port = ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	f, err := os.OpenFile(filepath.Join(s.dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = fmt.Fprintf(f, "\nport = %d\nunix_socket_directories = '%s'\nhot_standby = on\n%s\n", s.Port, base, conf)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	s.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.Port)
	if out, err := s.run("pg_ctl", "-D", s.dir, "-l", s.log, "-w", "-t", "60", "start"); err != nil {
		log, _ := os.ReadFile(s.log)
		t.Fatalf("pg_ctl start (standby): %v\n%s\n%s", err, out, log)
	}
	return s
}

// Stop stops the server in mode (immediate: as if it died).
func (o *OwnPostgres) Stop(t testing.TB, mode string) {
	t.Helper()
	if out, err := o.run("pg_ctl", "-D", o.dir, "-m", mode, "-w", "-t", "60", "stop"); err != nil {
		t.Fatalf("pg_ctl stop -m %s: %v\n%s", mode, err, out)
	}
}

// Start starts a stopped server again on the same port (after Stop; crash recovery first when
// it was stopped immediate).
func (o *OwnPostgres) Start(t testing.TB) {
	t.Helper()
	if out, err := o.run("pg_ctl", "-D", o.dir, "-l", o.log, "-w", "-t", "60", "start"); err != nil {
		t.Fatalf("pg_ctl start: %v\n%s\n%s", err, out, o.Log())
	}
}

// Promote promotes a standby to a primary on a new timeline (pg_ctl promote, waiting until it
// accepts writes).
func (o *OwnPostgres) Promote(t testing.TB) {
	t.Helper()
	if out, err := o.run("pg_ctl", "-D", o.dir, "-w", "-t", "60", "promote"); err != nil {
		log, _ := os.ReadFile(o.log)
		t.Fatalf("pg_ctl promote: %v\n%s\n%s", err, out, log)
	}
}

// Log is the server's log so far, for a failing test's message.
func (o *OwnPostgres) Log() string {
	b, _ := os.ReadFile(o.log)
	return strings.TrimSpace(string(b))
}

// DataDir is the cluster's data directory, for tests that break it on purpose (removing a WAL
// segment under pg_wal).
func (o *OwnPostgres) DataDir() string { return o.dir }
