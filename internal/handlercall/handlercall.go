// Package handlercall holds the rules of one handler call that the consumer loop (package
// kafkatx) and its test kit (package kafkatxtest) share, so that the kit runs the loop's own
// code rather than a copy: panic capture, the sorting of a handler's answer (done, run the
// transaction again, wait for a dependency, or a failure that counts as an attempt), the class,
// message and stack stored with a failure, when a message is given up on, and the claim of
// business idempotency keys.
//
// It cannot import package kafkatx (which imports it): where a rule needs one of kafkatx's
// error types, the caller passes the check (kafkatx.IsUnavailable, the cause of a
// *kafkatx.PermanentError).
package handlercall

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"runtime/debug"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kafkatx/kafkatx/dlq"
	"github.com/kafkatx/kafkatx/idempotency"
	"github.com/kafkatx/kafkatx/outbox"
	"github.com/kafkatx/kafkatx/pg"
)

// Error classes, equal to kafkatx's ErrorClass constants (a test in package kafkatx checks).
const (
	ClassPermanent = "permanent"
	ClassHandler   = "handler"
	ClassPanic     = "panic"
)

// Panic is a recovered handler panic with the stack of the goroutine that panicked.
type Panic struct {
	Value any
	Stack []byte
}

func (e *Panic) Error() string { return fmt.Sprintf("handler panicked: %v", e.Value) }

// Call runs f and returns its error, or a *Panic when f panics: a handler's panic never
// escapes the loop (a runtime.Goexit, as from t.FailNow, is not a panic and is not caught).
func Call(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &Panic{Value: r, Stack: debug.Stack()}
		}
	}()
	return f()
}

// Verdict is what the loop does with a handler's answer.
type Verdict int

const (
	// Done: the handler succeeded; the transaction commits.
	Done Verdict = iota
	// Again: a retryable database condition or the worker's cancellation; the transaction is
	// rolled back and run again, and the try is not an attempt.
	Again
	// Wait: the handler answered Unavailable within its window; the transaction is rolled
	// back, the partition waits and runs the message again, not an attempt.
	Wait
	// Failed: the handler's own failure; an attempt, retried or dead-lettered (GiveUp).
	Failed
)

func (v Verdict) String() string {
	switch v {
	case Done:
		return "done"
	case Again:
		return "again"
	case Wait:
		return "wait"
	}
	return "failed"
}

// Sort returns the verdict on herr, the answer of a handler called with ctx. unavailable
// reports an Unavailable answer the partition still waits out (the loop's window applies; the
// kit passes kafkatx.IsUnavailable).
func Sort(ctx context.Context, herr error, unavailable func(error) bool) Verdict {
	switch {
	case herr == nil:
		return Done
	case RetryableDB(herr) || ctx.Err() != nil:
		return Again
	case unavailable(herr):
		return Wait
	}
	return Failed
}

// Describe splits a handler failure into the class, message and stack stored with its attempt
// and its dead letter: ClassPanic for a *Panic (with its stack), ClassPermanent when
// permanent(err) returns the error inside a Permanent wrapper (the message is that error's,
// the class already says "permanent"), else ClassHandler. Message and stack are sanitized and
// bounded (dlq.MaxErrorMessageBytes, dlq.MaxStackBytes).
func Describe(err error, permanent func(error) error) (class, msg, stack string) {
	class, msg = ClassHandler, err.Error()
	var pe *Panic
	if errors.As(err, &pe) {
		class, stack = ClassPanic, string(pe.Stack)
	} else if cause := permanent(err); cause != nil {
		class, msg = ClassPermanent, cause.Error()
	}
	return class, pg.SanitizeText(msg, dlq.MaxErrorMessageBytes), pg.SanitizeText(stack, dlq.MaxStackBytes)
}

// GiveUp reports whether a message whose last failure has class and that has had attempts
// tries is dead-lettered instead of tried again: a permanent failure at once, any other after
// maxAttempts tries (Config.Retry.MaxAttempts, crashes included).
func GiveUp(class string, attempts, maxAttempts int) bool {
	return class == ClassPermanent || attempts >= maxAttempts
}

// WriteDeadLetter writes dead letter d in tx (dlq.InsertTx) and, unless topic is "" (dead
// letters kept in the database only), its record for topic through the outbox in the same
// transaction, so the published dead letter exists if and only if its row does (invariant 4).
// It sets d.ID. A message failing again after a replay updates its row and is published again.
func WriteDeadLetter(ctx context.Context, tx pgx.Tx, schema string, d *dlq.DeadLetter, topic string) error {
	id, _, err := dlq.InsertTx(ctx, tx, schema, d)
	if err != nil {
		return err
	}
	d.ID = id
	if topic == "" {
		return nil
	}
	if _, err := (outbox.Writer{Schema: schema}).WriteTx(ctx, tx, dlq.Record(topic, d)); err != nil {
		return fmt.Errorf("publish dead letter through the outbox: %w", err)
	}
	return nil
}

// Claimed is what ClaimKeys found in one transaction's messages.
type Claimed struct {
	Fresh      []int // indexes of the messages the handler runs on: no business key, or its first claim
	Dups       []int // indexes skipped: their business key was claimed before
	NotChanges []int // indexes skipped: the key function answered idempotency.ErrNotAChange
}

// ClaimKeys derives the business idempotency key of each of msgs with key and claims the keys
// in tx under scope (store.ClaimManyTx). A message whose key was claimed before — in an
// earlier transaction or earlier in msgs — is skipped, and so is one whose key function
// answered idempotency.ErrNotAChange. A key function error, or a key longer than
// idempotency.MaxKeyBytes, fails message msgs[failed] with kerr, which the loop dead-letters
// as a permanent error. err is a database error of the claim.
func ClaimKeys(ctx context.Context, tx pgx.Tx, store idempotency.Store, scope string, key idempotency.KeyFunc, msgs []idempotency.Message) (cl Claimed, failed int, kerr, err error) {
	var keys []string
	var keyed []int
	skip := make(map[int]bool)
	for i, m := range msgs {
		k, ok, err := key(m)
		if errors.Is(err, idempotency.ErrNotAChange) {
			skip[i] = true
			cl.NotChanges = append(cl.NotChanges, i)
			continue
		}
		if err != nil {
			return Claimed{}, i, fmt.Errorf("idempotency key: %w", err), nil
		}
		if ok && len(k) > idempotency.MaxKeyBytes {
			return Claimed{}, i, fmt.Errorf("idempotency key of %d bytes is longer than %d", len(k), idempotency.MaxKeyBytes), nil
		}
		if ok && k != "" {
			keys = append(keys, k)
			keyed = append(keyed, i)
		}
	}
	if len(keys) > 0 {
		first, err := store.ClaimManyTx(ctx, tx, scope, keys)
		if err != nil {
			return Claimed{}, -1, nil, err
		}
		for j, ok := range first {
			if !ok {
				skip[keyed[j]] = true
				cl.Dups = append(cl.Dups, keyed[j])
			}
		}
	}
	cl.Fresh = make([]int, 0, len(msgs)-len(skip))
	for i := range msgs {
		if !skip[i] {
			cl.Fresh = append(cl.Fresh, i)
		}
	}
	return cl, -1, nil, nil
}

// RetryableDB reports whether err is a database condition that means "run the transaction
// again": serialization failure (40001), deadlock (40P01), a lock wait past lock_timeout
// (55P03), a session ended by idle_in_transaction_session_timeout (25P03) or
// idle_session_timeout (57P05), a write refused by a read-only server (25006: after a
// switchover the old primary stays up read-only), or a lost or refused connection. Such errors
// never count as attempts (docs/design.md, "Retry without an attempt"; Config.Transaction sets
// the timeouts).
func RetryableDB(err error) bool {
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
