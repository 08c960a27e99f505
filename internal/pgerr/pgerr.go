// Package pgerr is kafkatx's one classification of PostgreSQL errors: for an error a
// database call returned, whether it is the server's own condition (wait it out, run the work
// again, spend no attempt), a lost race with a concurrent transaction (run it again at once),
// or the statement's own doing (the message's failure, counted as an attempt). The loop, the
// relay, the dead-letter path, idempotency/httpmw and the kafkatx command all ask Classify;
// docs/failures.md explains the table code by code, and other docs link there instead of
// copying the list.
//
// The source of every rule is PostgreSQL 15's "PostgreSQL Error Codes" appendix (Appendix A):
// the SQLSTATE is what the server says, and its class (the first two characters) tells the
// kind. A code is the server's condition only when no statement's content can cause it —
// when the same statement would succeed on a healthy server. A code that a statement can
// bring on itself (one that locks too many relations, one that fills temp_file_limit, a COPY
// that names a missing file) stays the statement's: waiting would block a poison pill for
// ever, and a condition that every message meets is stopped by the loop's breaker instead.
package pgerr

import (
	"context"
	"errors"
	"io"
	"net"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Class is what an error says about who is at fault.
type Class uint8

const (
	// Other: not an answer of PostgreSQL nor a lost connection to it — nil, the caller's own
	// error, an HTTP client's failure (*url.Error), or a context that ended. The caller decides.
	Other Class = iota
	// Statement: PostgreSQL refused the statement, and the statement (its data, its SQL, the
	// privileges it needs) can be the cause. A handler's Statement error is an attempt.
	Statement
	// Conflict: the transaction lost a race with a concurrent one (40001, 40P01, 55P03,
	// 72000). Running it again is expected to succeed; it is never an attempt.
	Conflict
	// Server: the server's own condition — out of disk or connections, shutting down or
	// starting, read-only, an I/O error or corruption, a login refused, or the connection lost
	// or refused. No statement caused it and none can end it: wait it out (bounded, as
	// Config.UnavailableMaxWait bounds Unavailable) and run the work again, spending no
	// attempt.
	Server
)

// String returns "other", "statement", "conflict" or "server".
func (c Class) String() string {
	switch c {
	case Statement:
		return "statement"
	case Conflict:
		return "conflict"
	case Server:
		return "server"
	}
	return "other"
}

// Condition is an error's classification with what names it: SQLState ("53100") and Name
// ("disk_full", PostgreSQL's condition name from Appendix A) for an answer of the server;
// SQLState "" and Name "connection_lost" or "connection_refused" for a connection-level
// failure; both empty for Other.
type Condition struct {
	Class    Class
	SQLState string
	Name     string
}

// String is "53100 disk_full", "connection_lost", or "" for Other.
func (c Condition) String() string {
	switch {
	case c.SQLState != "" && c.Name != "":
		return c.SQLState + " " + c.Name
	case c.SQLState != "":
		return c.SQLState
	}
	return c.Name
}

// Classify returns Describe(err).Class.
func Classify(err error) Class { return Describe(err).Class }

// Waitable reports whether err is the server's condition or a lost race (Server or
// Conflict): run the work again without spending an attempt.
func Waitable(err error) bool {
	c := Classify(err)
	return c == Server || c == Conflict
}

// IsCode reports whether err holds a *pgconn.PgError with SQLSTATE code.
func IsCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}

// Describe classifies err. A *pgconn.PgError anywhere in err's chain decides by its SQLSTATE
// (the table in codes.go); otherwise a connection-level failure — *pgconn.ConnectError, a
// *net.OpError, io.EOF or io.ErrUnexpectedEOF, pgx's "conn closed", an error pgconn marks
// SafeToRetry (nothing was sent) — is Server. An *url.Error (net/http's failures) and a
// context's end are Other: they are the caller's, not the database's.
func Describe(err error) Condition {
	if err == nil {
		return Condition{}
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if c, ok := codes[pgErr.Code]; ok {
			return Condition{Class: c.class, SQLState: pgErr.Code, Name: c.name}
		}
		if c, ok := classes[classOf(pgErr.Code)]; ok {
			return Condition{Class: c.class, SQLState: pgErr.Code, Name: c.name}
		}
		return Condition{Class: Statement, SQLState: pgErr.Code}
	}
	var urlErr *url.Error
	if errors.As(err, &urlErr) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return Condition{}
	}
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) {
		return Condition{Class: Server, Name: "connection_refused"}
	}
	// *net.OpError, not net.Error: a syscall.Errno satisfies net.Error, so a file's
	// EISDIR would read as a lost connection.
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "listen" {
		return Condition{} // a listener that cannot bind is its caller's, never a connection's
	}
	if errors.As(err, &opErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || pgconn.SafeToRetry(err) {
		return Condition{Class: Server, Name: "connection_lost"}
	}
	// pgx reports a connection closed under a call, or broken, with these messages.
	msg := strings.ToLower(err.Error())
	for _, s := range []string{"conn closed", "unexpected eof", "connection reset", "broken pipe"} {
		if strings.Contains(msg, s) {
			return Condition{Class: Server, Name: "connection_lost"}
		}
	}
	return Condition{}
}

func classOf(code string) string {
	if len(code) < 2 {
		return code
	}
	return code[:2]
}
