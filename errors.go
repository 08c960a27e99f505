package kafkatx

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kafkatx/kafkatx/internal/handlercall"
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

// ErrTxOwnedByLoop is what Commit and Rollback return on the pgx.Tx a Handler, BatchHandler or
// Middleware is given: the transaction also holds the watermark advance and the dead letters,
// and only the loop commits it (after the handler returns nil) or rolls it back (after an
// error). The call does nothing else; the try is the handler's failure — an attempt, retried
// and dead-lettered after Config.Retry.MaxAttempts — even when the handler ignores the error
// and returns nil. tx.Begin (a savepoint) and every other method work as in pgx.
var ErrTxOwnedByLoop = handlercall.ErrTxOwnedByLoop

// permanentCause returns the error inside the first *PermanentError of err's chain, or nil:
// handlercall.Describe's check for the class "permanent".
func permanentCause(err error) error {
	var pe *PermanentError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return nil
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
// again" and never counts as an attempt; the list of conditions is handlercall.RetryableDB's.
func retryableDB(err error) bool { return handlercall.RetryableDB(err) }
