package kafkatx

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// PermanentError marks a handler error as not worth retrying: the message is dead-lettered
// at once. Create one with Permanent and detect one with errors.As.
type PermanentError struct {
	Err error
}

func (e *PermanentError) Error() string { return "permanent: " + e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent wraps err so that the consumer dead-letters the message without further
// attempts. Permanent(nil) returns nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// IsPermanent reports whether err or an error it wraps is a *PermanentError.
func IsPermanent(err error) bool {
	var pe *PermanentError
	return errors.As(err, &pe)
}

// Error classes stored with attempts and dead letters, and sent in the
// kafkatx.dlq.error.class header.
const (
	ErrorClassPermanent = "permanent" // the handler returned Permanent(err)
	ErrorClassHandler   = "handler"   // the handler returned an error, retried until max attempts
	ErrorClassPanic     = "panic"     // the handler panicked
	ErrorClassCrash     = "crash"     // the process stopped (crash, SIGKILL) while the handler ran
	ErrorClassOversized = "oversized" // the value exceeded Config.MaxValueBytes; the handler never ran
)

// panicError is a recovered handler panic with its stack.
type panicError struct {
	value any
	stack []byte
}

func (e *panicError) Error() string { return fmt.Sprintf("handler panicked: %v", e.value) }

func errorClass(err error) string {
	var pe *panicError
	switch {
	case errors.As(err, &pe):
		return ErrorClassPanic
	case IsPermanent(err):
		return ErrorClassPermanent
	default:
		return ErrorClassHandler
	}
}

// readOnlyServer reports whether err is SQLSTATE 25006 (read_only_sql_transaction): the
// connection reached a server that refuses writes — after a switchover the old primary stays
// up read-only and keeps answering pings. Retrying on the same connection never helps, so the
// loop discards the pool's connections (pgxpool.Pool.Reset) before it runs the transaction
// again; new connections reach the writable server when the URL says so
// (target_session_attrs=read-write with every host listed, docs/deployment.md).
func readOnlyServer(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "25006"
}

// retryableDB reports whether err is a database condition that means "run the transaction
// again": serialization failure (40001), deadlock (40P01), a lock wait past lock_timeout
// (55P03), a session ended by idle_in_transaction_session_timeout (25P03) or
// idle_session_timeout (57P05), a write refused by a read-only server (25006: after a
// switchover the old primary stays up read-only; see readOnlyServer), or a lost or refused
// connection. Such errors never count as attempts (docs/design.md, "Retry without an attempt";
// Config.Transaction sets the timeouts).
func retryableDB(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "40001", "40P01", // serialization_failure, deadlock_detected
			"55P03",          // lock_not_available: lock_timeout passed (a frozen holder, Config.Transaction)
			"25P03", "57P05", // idle_in_transaction_session_timeout, idle_session_timeout: the session was ended
			"25006",                   // read_only_sql_transaction: a read-only server (old primary, standby)
			"57P01", "57P02", "57P03", // admin_shutdown, crash_shutdown, cannot_connect_now
			"08000", "08003", "08006", "08001", "08004": // connection exceptions
			return true
		}
		return false
	}
	if pgconn.SafeToRetry(err) || pgconn.Timeout(err) {
		return true
	}
	// An HTTP client's failure (net/http reports every one as a *url.Error, itself a
	// net.Error) is the handler's own, never the loop's database: it is a handler error.
	var urlErr *url.Error
	if errors.As(err, &urlErr) {
		return false
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return true
	}
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) {
		return true
	}
	// pgx reports a closed or broken connection with these messages.
	msg := strings.ToLower(err.Error())
	for _, s := range []string{"conn closed", "unexpected eof", "connection reset", "broken pipe"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}
