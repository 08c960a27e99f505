package pgerr_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kafkatx/kafkatx/internal/pgerr"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

func pgErr(code string) error { return &pgconn.PgError{Code: code, Message: "m"} }

// TestClassifyTable: a row per code of the table in codes.go whose class decides the loop's
// answer, plus class rows, wrapping, and the connection-level errors.
func TestClassifyTable(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want pgerr.Class
		name string
	}{
		{nil, pgerr.Other, ""},
		{errors.New("handler said no"), pgerr.Other, ""},
		{context.Canceled, pgerr.Other, ""},
		{context.DeadlineExceeded, pgerr.Other, ""},
		{&url.Error{Op: "Post", URL: "http://x", Err: &net.OpError{Op: "dial", Err: errors.New("refused")}}, pgerr.Other, ""},
		// The server's conditions.
		{pgErr("53100"), pgerr.Server, "disk_full"},
		{pgErr("53300"), pgerr.Server, "too_many_connections"},
		{pgErr("53000"), pgerr.Server, "insufficient_resources"},
		{pgErr("58030"), pgerr.Server, "io_error"},
		{pgErr("58000"), pgerr.Server, "system_error"},
		{pgErr("XX001"), pgerr.Server, "data_corrupted"},
		{pgErr("XX002"), pgerr.Server, "index_corrupted"},
		{pgErr("57P01"), pgerr.Server, "admin_shutdown"},
		{pgErr("57P02"), pgerr.Server, "crash_shutdown"},
		{pgErr("57P03"), pgerr.Server, "cannot_connect_now"},
		{pgErr("57P05"), pgerr.Server, "idle_session_timeout"},
		{pgErr("25P03"), pgerr.Server, "idle_in_transaction_session_timeout"},
		{pgErr("25006"), pgerr.Server, "read_only_sql_transaction"},
		{pgErr("08000"), pgerr.Server, "connection_exception"},
		{pgErr("08001"), pgerr.Server, "sqlclient_unable_to_establish_sqlconnection"},
		{pgErr("08003"), pgerr.Server, "connection_does_not_exist"},
		{pgErr("08004"), pgerr.Server, "sqlserver_rejected_establishment_of_sqlconnection"},
		{pgErr("08006"), pgerr.Server, "connection_failure"},
		{pgErr("08007"), pgerr.Server, "transaction_resolution_unknown"},
		{pgErr("28P01"), pgerr.Server, "invalid_password"},
		{pgErr("3D000"), pgerr.Server, "invalid_catalog_name"},
		// Lost races.
		{pgErr("40001"), pgerr.Conflict, "serialization_failure"},
		{pgErr("40P01"), pgerr.Conflict, "deadlock_detected"},
		{pgErr("55P03"), pgerr.Conflict, "lock_not_available"},
		// The statement's own doing.
		{pgErr("53200"), pgerr.Statement, "out_of_memory"},
		{pgErr("53400"), pgerr.Statement, "configuration_limit_exceeded"},
		{pgErr("57P04"), pgerr.Statement, "database_dropped"},
		{pgErr("58P01"), pgerr.Statement, "undefined_file"},
		{pgErr("08P01"), pgerr.Statement, "protocol_violation"},
		{pgErr("57014"), pgerr.Statement, "query_canceled"},
		{pgErr("XX000"), pgerr.Statement, "internal_error"},
		{pgErr("25P02"), pgerr.Statement, "in_failed_sql_transaction"},
		{pgErr("23505"), pgerr.Statement, ""},
		{pgErr("22003"), pgerr.Statement, ""},
		{pgErr("42501"), pgerr.Statement, ""},
		{pgErr("P0001"), pgerr.Statement, ""},
		// Class rows: codes not listed take their class's.
		{pgErr("08999"), pgerr.Server, "connection_exception"},
		{pgErr("53999"), pgerr.Server, "insufficient_resources"},
		{pgErr("58999"), pgerr.Server, "system_error"},
		{pgErr("XX999"), pgerr.Statement, "internal_error"},
		// Wrapped, the SQLSTATE still decides.
		{fmt.Errorf("insert order: %w", pgErr("53100")), pgerr.Server, "disk_full"},
		{fmt.Errorf("add: %w", fmt.Errorf("x: %w", pgErr("40P01"))), pgerr.Conflict, "deadlock_detected"},
		// Connection level.
		{io.EOF, pgerr.Server, "connection_lost"},
		{fmt.Errorf("read: %w", io.ErrUnexpectedEOF), pgerr.Server, "connection_lost"},
		{&net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer")}, pgerr.Server, "connection_lost"},
		{net.ErrClosed, pgerr.Server, "connection_lost"},
		{errors.New("conn closed"), pgerr.Server, "connection_lost"},
	} {
		d := pgerr.Describe(tc.err)
		if d.Class != tc.want || d.Name != tc.name {
			t.Errorf("Describe(%v) = %v %q, want %v %q", tc.err, d.Class, d.Name, tc.want, tc.name)
		}
		if pgerr.Classify(tc.err) != tc.want {
			t.Errorf("Classify(%v) = %v, want %v", tc.err, pgerr.Classify(tc.err), tc.want)
		}
		if w := tc.want == pgerr.Server || tc.want == pgerr.Conflict; pgerr.Waitable(tc.err) != w {
			t.Errorf("Waitable(%v) = %v, want %v", tc.err, !w, w)
		}
	}
}

// TestClassifyRealServer: the errors pgx returns from a real PostgreSQL and a real refused
// connection classify as the table says.
func TestClassifyRealServer(t *testing.T) {
	pool := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	raise := func(code string) error {
		_, err := pool.Exec(ctx, fmt.Sprintf(`DO $$ BEGIN RAISE EXCEPTION 'played' USING ERRCODE = '%s'; END $$`, code))
		return err
	}
	for code, want := range map[string]pgerr.Class{"53100": pgerr.Server, "40P01": pgerr.Conflict, "53400": pgerr.Statement, "23505": pgerr.Statement} {
		if got := pgerr.Describe(raise(code)); got.Class != want || got.SQLState != code {
			t.Errorf("a real %s: %+v, want class %v", code, got, want)
		}
	}
	// A refused connection (nothing listens on port 1).
	_, err := pgx.Connect(ctx, "postgres://u:p@127.0.0.1:1/db?connect_timeout=2")
	if d := pgerr.Describe(err); d.Class != pgerr.Server || d.Name != "connection_refused" {
		t.Errorf("a refused connection (%v): %+v", err, d)
	}
	// A connection closed under a query.
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	pc := conn.Conn().PgConn()
	if err := pc.Close(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(ctx, "SELECT 1")
	if d := pgerr.Describe(err); d.Class != pgerr.Server {
		t.Errorf("a closed connection (%v): %+v", err, d)
	}
	// pg_terminate_backend ends a session: 57P01 on its next statement.
	c2, err := pgx.Connect(ctx, testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close(ctx)
	if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, c2.PgConn().PID()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	_, err = c2.Exec(ctx, "SELECT 1")
	if d := pgerr.Describe(err); d.Class != pgerr.Server {
		t.Errorf("a terminated session (%v): %+v", err, d)
	}
}

// TestFileErrorsAreNotConnections: a syscall.Errno satisfies net.Error; a file's error must
// not read as a lost connection.
func TestFileErrorsAreNotConnections(t *testing.T) {
	_, err := os.ReadFile(t.TempDir())
	if err == nil || pgerr.Classify(err) != pgerr.Other {
		t.Fatalf("reading a directory: %v classified %v, want other", err, pgerr.Classify(err))
	}
}
