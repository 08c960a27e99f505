// The rules of one handler call, shared by the loop's partition worker and the test kit
// (package kafkatxtest) through Body: panic capture, the sorting of a handler's answer (done,
// run the transaction again, wait for a dependency, or a failure that counts as an attempt),
// the class, message and stack stored with a failure, when a message is given up on, and the
// claim of business idempotency keys. kafkatx's control errors are recognised by their
// methods (Unavailable() bool, Permanent() bool), so nothing of package kafkatx is needed here.
package engine

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kafkatx/kafkatx/dlq"
	"github.com/kafkatx/kafkatx/idempotency"
	"github.com/kafkatx/kafkatx/internal/pgerr"
	"github.com/kafkatx/kafkatx/outbox"
	"github.com/kafkatx/kafkatx/pg"
)

// Error classes stored with attempts and dead letters and sent in the kafkatx.dlq.error.class
// header; package kafkatx exports them as its ErrorClass constants.
const (
	ClassPermanent = "permanent" // the handler returned kafkatx.Permanent(err)
	ClassHandler   = "handler"   // the handler returned an error, retried until max attempts
	ClassPanic     = "panic"     // the handler panicked
	ClassCrash     = "crash"     // the process stopped (crash, SIGKILL) while the handler ran
	ClassOversized = "oversized" // the value exceeded Config.MaxValueBytes; the handler never ran
)

// Panic is a recovered panic of user code the loop called — the handler, a middleware, the
// idempotency key function, a method of the handler's error value — with the stack of the
// goroutine that panicked. Its class is ClassPanic: an attempt, like a handler panic.
type Panic struct {
	Value any
	Stack []byte
	// Of names what panicked in Error's text; "" means "handler".
	Of string
}

func (e *Panic) Error() string {
	of := e.Of
	if of == "" {
		of = "handler"
	}
	return fmt.Sprintf("%s panicked: %v", of, e.Value)
}

// Call runs f and returns its error, or a *Panic when f panics: a handler's panic never
// escapes the loop (a runtime.Goexit, as from t.FailNow, is not a panic and is not caught).
// A non-nil error's Error method is called once inside the recover, so an error value that
// panics when printed (a nil *T whose Error dereferences it) is a *Panic too, not a crash of
// the loop when it logs or stores the message.
func Call(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &Panic{Value: r, Stack: debug.Stack()}
		}
	}()
	err = f()
	if err != nil {
		_ = err.Error()
	}
	return err
}

// ErrTxOwnedByLoop is the answer of Commit and Rollback on the pgx.Tx the loop hands a handler
// (OwnTx): the transaction is the loop's — it also holds the watermark advance, the attempt
// bookkeeping and the dead letters — and only the loop ends it. Package kafkatx exports it as
// kafkatx.ErrTxOwnedByLoop.
var ErrTxOwnedByLoop = errors.New("kafkatx: the transaction belongs to the consumer loop, which commits or rolls it back after the handler returns; " +
	"return nil to commit, an error to roll back (use tx.Begin for a savepoint)")

// Tx is the pgx.Tx handed to the handler and its middleware: every method passes through to
// the loop's transaction — Begin (a savepoint, whose own Commit and Rollback work), Exec,
// Query, CopyFrom, SendBatch, Conn — except Commit and Rollback, which do nothing and return
// ErrTxOwnedByLoop.
type Tx struct {
	pgx.Tx
	refused atomic.Bool
}

// OwnTx wraps tx, the loop's transaction, for a handler call.
func OwnTx(tx pgx.Tx) *Tx { return &Tx{Tx: tx} }

// Commit refuses: see ErrTxOwnedByLoop.
func (t *Tx) Commit(context.Context) error { t.refused.Store(true); return ErrTxOwnedByLoop }

// Rollback refuses: see ErrTxOwnedByLoop.
func (t *Tx) Rollback(context.Context) error { t.refused.Store(true); return ErrTxOwnedByLoop }

// CallTx is Call for a handler call given tx, the loop's transaction, wrapped by OwnTx: the
// handler cannot commit or roll it back, and a handler that tried and then returned nil
// anyway has failed with ErrTxOwnedByLoop (the loop cannot tell what it meant to keep), an
// attempt like any handler error; it never commits the loop's transaction twice.
func CallTx(tx pgx.Tx, f func(pgx.Tx) error) error {
	own := OwnTx(tx)
	err := Call(func() error { return f(own) })
	if err == nil && own.refused.Load() {
		err = fmt.Errorf("the handler called Commit or Rollback on the loop's transaction and returned nil: %w", ErrTxOwnedByLoop)
	}
	return err
}

// Verdict is what the loop does with a handler's answer.
type Verdict int

const (
	// Done: the handler succeeded; the transaction commits.
	Done Verdict = iota
	// Again: the worker's cancellation, a retryable PostgreSQL error, or the loop's own
	// transaction connection lost (see Sort); the transaction is rolled back and run again,
	// and the try is not an attempt.
	Again
	// Wait: the handler answered Unavailable, or met the database's own condition, within
	// its window; the transaction is rolled back, the partition waits and runs the message
	// again, not an attempt.
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

// Sort returns the verdict on herr, the answer of a handler called with ctx (the loop's, or
// the worker's, context) in tx (the loop's transaction). The rule, in order:
//
//   - nil: Done.
//   - Again — run the transaction again, not an attempt — only when (a) ctx is done (shutdown,
//     a lost partition), (b) herr holds a *pgconn.PgError of internal/pgerr's Conflict class
//     (a lost race: 40001, 40P01, 55P03, ...), or (c) tx's connection is closed after the
//     handler returned (the server or the network dropped it) and herr is not the handler's
//     own context ending.
//   - Wait: herr holds a *pgconn.PgError of pgerr's Server class (the server's own condition:
//     53100 disk_full, 53300, 58030, 25006, ...; docs/failures.md), or an Unavailable answer
//     (IsUnavailable). The loop applies its window: once Config.UnavailableMaxWait has passed
//     for the message, it counts the answer as Failed.
//   - Failed: everything else, an attempt retried with backoff and dead-lettered at
//     MaxAttempts. That includes a context.DeadlineExceeded or context.Canceled of a context
//     the handler made while ctx is alive — its own timeout, even when pgx closed tx's
//     connection because of it (the loop records the attempt on another connection) — and
//     any net.Error, *url.Error or *pgconn.ConnectError of the handler's own calls: no error
//     text is guessed at, tx's connection is asked.
//
// err is herr, or a *Panic when a method of herr's value (Is, As, Unwrap, Unavailable)
// panicked while it was sorted: that verdict is Failed.
func Sort(ctx context.Context, tx pgx.Tx, herr error) (v Verdict, err error) {
	if herr == nil {
		return Done, nil
	}
	defer func() {
		if r := recover(); r != nil {
			v, err = Failed, &Panic{Value: r, Stack: debug.Stack(), Of: "a method of the handler's error"}
		}
	}()
	_, server := ServerCondition(herr)
	switch {
	case ctx.Err() != nil, RetryableSQLState(herr) && !server:
		return Again, herr
	case connLost(tx) && !errors.Is(herr, context.DeadlineExceeded) && !errors.Is(herr, context.Canceled):
		return Again, herr
	case server, IsUnavailable(herr):
		return Wait, herr
	}
	return Failed, herr
}

// connLost reports whether tx's connection is closed: pgx closes it on a network error, a
// server that ended the session, or a context that ended during a statement.
func connLost(tx pgx.Tx) bool {
	if tx == nil {
		return false
	}
	c := tx.Conn()
	return c != nil && c.IsClosed()
}

// Describe splits a handler failure into the class, message and stack stored with its attempt
// and its dead letter: ClassPanic for a *Panic (with its stack), ClassPermanent when
// PermanentCause(err) returns the error inside a Permanent wrapper (the message is that error's,
// the class already says "permanent"), else ClassHandler. Message and stack are sanitized and
// bounded (dlq.MaxErrorMessageBytes, dlq.MaxStackBytes).
func Describe(err error) (class, msg, stack string) {
	class, msg = ClassHandler, err.Error()
	var pe *Panic
	if errors.As(err, &pe) {
		class, stack = ClassPanic, string(pe.Stack)
	} else if cause := PermanentCause(err); cause != nil {
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
// The published record's kafkatx-outbox-id is derived from the message (DeadLetterSource), so
// a dead letter written again after its first write was lost (a database failover or restore)
// is published under the same id, and a consumer of the dead-letter topic that deduplicates by
// it sees it once; a replay epoch raised by `kafkatx offsets reset --mode replay` gives new ids.
func WriteDeadLetter(ctx context.Context, tx pgx.Tx, schema string, d *dlq.DeadLetter, topic string) error {
	id, _, err := dlq.InsertTx(ctx, tx, schema, d)
	if err != nil {
		return err
	}
	d.ID = id
	if topic == "" {
		return nil
	}
	rec := dlq.Record(topic, d)
	rec.Source = DeadLetterSource(d)
	if _, err := (outbox.Writer{Schema: schema}).WriteTx(ctx, tx, rec); err != nil {
		return fmt.Errorf("publish dead letter through the outbox: %w", err)
	}
	return nil
}

// DeadLetterSource is the outbox source of dead letter d's record on its dead-letter topic: the
// message's topic, partition and offset in the scope "group/epoch/dead-letter", followed by
// "/topic id" when d's log is known (dlq.InsertTx sets d.TopicID, so a new log's dead letter
// at an old one's offset gets an id of its own) — the handler's own records use
// "group/epoch[/topic id]", so a dead letter's id never equals one of theirs.
func DeadLetterSource(d *dlq.DeadLetter) *outbox.Source {
	scope := fmt.Sprintf("%s/%d/dead-letter", d.Group, d.ReplayEpoch)
	if d.TopicID != "" {
		scope += "/" + d.TopicID
	}
	return &outbox.Source{Scope: scope, Topic: d.Topic, Partition: d.Partition, Offset: d.Offset}
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
// as a permanent error. A key function that panics fails msgs[failed] with a *Panic (class
// ClassPanic, its stack kept), which the loop treats as a handler panic: an attempt, retried,
// dead-lettered at MaxAttempts — not permanent, since a panic may come from state other than
// the message's bytes. err is a database error of the claim.
func ClaimKeys(ctx context.Context, tx pgx.Tx, store idempotency.Store, scope string, key idempotency.KeyFunc, msgs []idempotency.Message) (cl Claimed, failed int, kerr, err error) {
	var keys []string
	var keyed []int
	skip := make(map[int]bool)
	for i, m := range msgs {
		k, ok, err := callKey(key, m)
		if err != nil {
			// Only here: errors.As's target escapes to the heap, which cost an allocation per
			// message when declared for every one.
			var pe *Panic
			if errors.As(err, &pe) {
				return Claimed{}, i, pe, nil
			}
			if errors.Is(err, idempotency.ErrNotAChange) {
				skip[i] = true
				cl.NotChanges = append(cl.NotChanges, i)
				continue
			}
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

// callKey calls key on m, recovering a panic as a *Panic.
func callKey(key idempotency.KeyFunc, m idempotency.Message) (k string, ok bool, err error) {
	defer func() {
		if r := recover(); r != nil {
			k, ok, err = "", false, &Panic{Value: r, Stack: debug.Stack(), Of: "the idempotency key function (Config.Idempotency.Key)"}
		}
	}()
	k, ok, err = key(m)
	if err != nil {
		_ = err.Error()
	}
	return k, ok, err
}

// RetryableSQLState reports whether err holds a *pgconn.PgError whose SQLSTATE is not the
// statement's: the server's own condition or a lost race (internal/pgerr's Server and
// Conflict classes, docs/failures.md#the-classification-code-by-code). Such an error never
// counts as an attempt.
func RetryableSQLState(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgerr.Waitable(err)
}

// ServerCondition returns the server's own condition err holds — a *pgconn.PgError of
// internal/pgerr's Server class (53100 disk_full, 53300, 58030, 25006, ...) — or ok false.
// Connection-level errors are not read here: Sort asks the transaction's connection instead.
func ServerCondition(err error) (c pgerr.Condition, ok bool) {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return pgerr.Condition{}, false
	}
	c = pgerr.Describe(err)
	return c, c.Class == pgerr.Server
}

// RetryableDB reports whether err, an error of the loop's OWN statements (attempt rows,
// markers, the watermark, COMMIT), means "run it again": internal/pgerr's one classification
// says the server's condition or a lost race (pgerr.Waitable: a Server or Conflict SQLSTATE, a
// lost or refused connection), or the statement ran past its deadline (pgconn.Timeout, context.DeadlineExceeded; pgerr
// leaves a context's end to its caller, and for the loop's own statement it is the database
// not answering in time). It only sorts the loop's log line: untilDone runs its work again
// either way. A handler's answer is sorted by Sort, which asks the transaction's connection
// instead (a handler's own timeout or network error is its failure).
func RetryableDB(err error) bool {
	return pgerr.Waitable(err) || pgconn.Timeout(err) || errors.Is(err, context.DeadlineExceeded)
}
