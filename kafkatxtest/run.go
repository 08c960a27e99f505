package kafkatxtest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/dlq"
	"github.com/kafkatx/kafkatx/idempotency"
	"github.com/kafkatx/kafkatx/internal/engine"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/internal/outboxpack"
	"github.com/kafkatx/kafkatx/internal/parking"
	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/outbox"
	"github.com/kafkatx/kafkatx/pg"
)

// Kind is what the loop does with a message after one try.
type Kind int

const (
	// Committed: the handler succeeded; its effects commit with the watermark advance.
	Committed Kind = iota + 1
	// Duplicate: the message's business idempotency key was claimed before (in an earlier
	// transaction, or by an earlier message of the run); the handler did not run for it.
	Duplicate
	// NotAChange: the key function answered idempotency.ErrNotAChange; the handler did not
	// run for it and the offset is passed.
	NotAChange
	// Retried: the handler failed at Outcome.Attempt, below Config.Retry.MaxAttempts; the
	// attempt is recorded and the loop runs the message again, alone, after a backoff.
	Retried
	// DeadLettered: the handler failed with Permanent, or at attempt MaxAttempts or later
	// (or its key function failed); Outcome.DeadLetter was written in the transaction.
	DeadLettered
	// Unavailable: the handler answered kafkatx.Unavailable; the try is rolled back, the
	// partition waits and runs it again, and it is not an attempt.
	Unavailable
	// Parked: with Config.Park.Enabled, the message's key is parked: the handler failed with
	// attempts left, or answered kafkatx.Unavailable, with a failure not the database's (the
	// loop's rule, engine.KeyFailure; the kit has no breaker), or an earlier message of its
	// key was parked in the same Tx — then the handler did not run for it. Its row of
	// key_parking is written in the transaction as the loop writes it; the loop runs it later,
	// after the key's earlier parked messages, in offset order.
	Parked
	// RunAgain: the handler returned a PostgreSQL error of a lost race (docs/failures.md;
	// see kafkatx.Handler), the transaction's connection was lost under it (and its error is not
	// its own context ending), or the test's context ended; the try is rolled back and run
	// again, and it is not an attempt. A handler's own timeout, cancellation or network error
	// is Retried or DeadLettered instead.
	RunAgain
)

func (k Kind) String() string {
	switch k {
	case Committed:
		return "committed"
	case Duplicate:
		return "duplicate"
	case NotAChange:
		return "not-a-change"
	case Retried:
		return "retried"
	case DeadLettered:
		return "dead-lettered"
	case Unavailable:
		return "unavailable"
	case RunAgain:
		return "run-again"
	case Parked:
		return "parked"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Outcome is what one try did to one message.
type Outcome struct {
	Message *kafkatx.Message
	Kind    Kind
	// Attempt is the try: Message.Attempt, or 1 when it is 0.
	Attempt int
	// Err is the handler's error for this message (FailMessage's wrapper removed), or for an
	// Unavailable or RunAgain batch the batch's error; nil when Committed or skipped.
	Err error
	// ErrorClass, ErrorMessage and Stack are what the loop stores with the attempt and the
	// dead letter (Retried, DeadLettered): kafkatx.ErrorClassPermanent, ErrorClassHandler
	// or ErrorClassPanic; the sanitized message; the stack of a panic.
	ErrorClass, ErrorMessage, Stack string
	// DeadLetter is the dead letter written in the transaction (DeadLettered), with its ID.
	DeadLetter *dlq.DeadLetter
}

func (o Outcome) String() string {
	s := fmt.Sprintf("%s[%d]@%d attempt %d: %s", o.Message.Topic, o.Message.Partition, o.Message.Offset, o.Attempt, o.Kind)
	if o.ErrorClass != "" {
		s += fmt.Sprintf(" (%s: %s)", o.ErrorClass, o.ErrorMessage)
	} else if o.Err != nil {
		s += fmt.Sprintf(" (%v)", o.Err)
	}
	return s
}

// Tx is a transaction of the kit's pool, rolled back when the test ends (or by Rollback),
// in which handlers run the way the loop runs them. Its pgx.Tx is the caller's too: prepare
// rows before Run, read the handler's effects after.
type Tx struct {
	pgx.Tx
	k        *Kit
	outcomes []Outcome
	parked   map[string]bool // keys parked in this Tx (parking.KeyHash), with Config.Park
}

// LockTimeout is the lock_timeout of the kit's transactions. Transactions of one test stay
// open until it ends, so two of them writing the same row (a dead letter of the same offset,
// the same idempotency key) would wait on each other for good; past LockTimeout the second
// fails with SQLSTATE 55P03 instead. Roll the first back (Tx.Rollback) or use distinct
// offsets and keys.
const LockTimeout = 5 * time.Second

// Begin opens a transaction on the kit's pool, rolled back when the test ends, with
// LockTimeout. A database error, or no free connection within 10 s, fails the test.
func (k *Kit) Begin() *Tx {
	k.t.Helper()
	ctx, cancel := context.WithTimeout(k.ctx(), 10*time.Second)
	defer cancel()
	tx, err := k.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: fmt.Sprintf("BEGIN; SET LOCAL lock_timeout = %d", LockTimeout.Milliseconds())})
	if err != nil {
		if k.ctx().Err() != nil {
			k.t.Fatalf("kafkatxtest: begin: %v (the test's context is done: t.Context() is cancelled before t.Cleanup functions run, "+
				"so the kit cannot run handlers from a Cleanup or after the test returned)", err)
		}
		k.t.Fatalf("kafkatxtest: begin (each Tx holds a connection until the test ends or Tx.Rollback): %v", err)
	}
	k.t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return &Tx{Tx: tx, k: k}
}

// Run runs h over msgs in a new transaction (Begin, then Tx.Run) and returns it.
func (k *Kit) Run(h kafkatx.Handler, msgs ...*kafkatx.Message) *Tx {
	k.t.Helper()
	if h == nil {
		k.t.Fatal(errNilHandler)
	}
	tx := k.Begin()
	tx.Run(h, msgs...)
	return tx
}

// RunBatch runs h over msgs in a new transaction (Begin, then Tx.RunBatch) and returns it.
func (k *Kit) RunBatch(h kafkatx.BatchHandler, msgs ...*kafkatx.Message) *Tx {
	k.t.Helper()
	if h == nil {
		k.t.Fatal(errNilBatchHandler)
	}
	tx := k.Begin()
	tx.RunBatch(h, msgs...)
	return tx
}

// ctx is the test's context, cancelled just before its cleanups run.
func (k *Kit) ctx() context.Context { return k.t.Context() }

// Run runs the per-message handler h over msgs as the loop runs a Handler (each message in
// turn inside the batch's try, a failure naming its message, a panic recovered) and returns
// the outcome of each message, in order; see RunBatch.
func (tx *Tx) Run(h kafkatx.Handler, msgs ...*kafkatx.Message) []Outcome {
	tx.k.t.Helper()
	if h == nil {
		tx.k.t.Fatal(errNilHandler)
	}
	return tx.RunBatch(func(ctx context.Context, btx pgx.Tx, msgs []*kafkatx.Message) error {
		for _, m := range msgs {
			// As the loop calls a Handler: ctx carries m's outbox source.
			mctx := outbox.WithSource(ctx, m.OutboxSource())
			if err := engine.Call(func() error { return h(mctx, btx, m) }); err != nil {
				return kafkatx.FailMessage(m, err)
			}
		}
		return nil
	}, msgs...)
}

// RunBatch runs h over msgs (one partition's messages in offset order) one try each, as the
// loop would: all of them in one try (a savepoint of tx), claiming their business keys
// first; when the try fails naming a message (FailMessage, or a batch of one), the messages
// before it are run again as a batch, the failure settles that message (Retried or
// DeadLettered, with Message.Attempt as the attempt), and the rest go on as a batch; when it
// fails naming none, the messages run one per try. A failed try's writes are rolled back; a
// dead letter is written in tx as the loop writes it. It returns the outcome of each message
// in order (also kept for Outcome and Outcomes). A database error of the kit's own statements
// fails the test, and so does a nil h (kafkatx.NewBatchConsumer refuses one too).
//
// The handler's pgx.Tx is the loop's wrapper: Commit and Rollback return
// kafkatx.ErrTxOwnedByLoop and count as the handler's failure; Begin opens a savepoint.
func (tx *Tx) RunBatch(h kafkatx.BatchHandler, msgs ...*kafkatx.Message) []Outcome {
	tx.k.t.Helper()
	if h == nil {
		tx.k.t.Fatal(errNilBatchHandler)
	}
	from := len(tx.outcomes)
	tx.process(tx.k.ctx(), tx.chain(h), msgs)
	return tx.outcomes[from:]
}

// chain wraps h in Config.Middleware as kafkatx.NewConsumer does (kafkatx.Chain), failing the
// test where NewConsumer returns an error: a middleware that panics while wrapping, or returns
// nil.
func (tx *Tx) chain(h kafkatx.BatchHandler) kafkatx.BatchHandler {
	tx.k.t.Helper()
	out, err := kafkatx.Chain(h, tx.k.middleware...)
	if err != nil {
		tx.k.t.Fatalf("kafkatxtest: %v (kafkatx.NewConsumer returns this as an error)", err)
	}
	return out
}

// The kit refuses a nil handler as kafkatx.NewConsumer and NewBatchConsumer do.
const (
	errNilHandler      = "kafkatxtest: nil Handler (kafkatx.NewConsumer refuses it too: \"kafkatx: nil Handler\")"
	errNilBatchHandler = "kafkatxtest: nil BatchHandler (kafkatx.NewBatchConsumer refuses it too: \"kafkatx: nil BatchHandler\")"
)

// connClosedHint explains a kit statement that failed because the handler left the
// transaction's connection closed.
func (tx *Tx) connClosedHint() string {
	if c := tx.Conn(); c != nil && c.IsClosed() {
		return " (the transaction's connection is closed: a handler whose own context ended during a statement makes pgx close it; " +
			"the loop counts that try as an attempt and goes on with a new connection, but this Tx cannot go on — run the next messages in a new Kit.Run)"
	}
	return ""
}

// process runs msgs as the loop's partition worker does: cut into tries by the loop's own
// split (engine.Split), a failed message settled (Retried or DeadLettered) where the loop
// would run it alone.
func (tx *Tx) process(ctx context.Context, h kafkatx.BatchHandler, msgs []*kafkatx.Message) {
	tx.k.t.Helper()
	failed := map[int]error{} // message index -> its failure in a batch's try
	sp := engine.Split{
		Alone: func(i int) bool { _, ok := failed[i]; return ok || tx.keyParked(msgs[i]) },
		Batch: func(i, j int) (int, error) {
			f, herr := tx.try(ctx, h, msgs[i:j])
			if f >= 0 {
				failed[i+f] = herr
			}
			return f, nil
		},
		One: func(i int) error {
			if tx.keyParked(msgs[i]) {
				tx.park(ctx, Outcome{Message: msgs[i], Kind: Parked, Attempt: attempt(msgs[i])}, false)
				return nil
			}
			tx.settle(ctx, msgs[i], failed[i])
			return nil
		},
	}
	_ = sp.Run(len(msgs)) // the kit's callbacks fail the test instead of returning errors
}

// try runs h over batch in a savepoint with the loop's own transaction body (engine.Body):
// it records the outcomes and returns -1 when the try ended (committed, skipped, or an
// Unavailable/RunAgain answer for the whole batch), or the index of the message whose failure
// herr is, or engine.Unattributed. What the loop does after the body — the watermark, COMMIT,
// the Kafka commit — is replaced by the savepoint's release in tx, rolled back with the test.
func (tx *Tx) try(ctx context.Context, h kafkatx.BatchHandler, batch []*kafkatx.Message) (failed int, herr error) {
	tx.k.t.Helper()
	k := tx.k
	sp, err := tx.Tx.Begin(ctx)
	if err != nil {
		k.t.Fatalf("kafkatxtest: savepoint: %v%s", err, tx.connClosedHint())
	}
	defer func() { _ = sp.Rollback(context.WithoutCancel(ctx)) }()
	body := engine.Body[*kafkatx.Message]{Handler: h, Keyed: keyed, Prepare: k.prepare}
	if !k.idem.Disabled {
		body.Claims = &engine.Claims{Store: idempotency.Store{Schema: k.schema, Retention: k.idem.Retention}, Key: k.idem.Key}
	}
	k.stampSources(batch)
	t := body.Prepared(ctx, batch) // Config.Prepare, outside the loop's transaction
	if t.Verdict == engine.Done {
		t, err = body.Try(ctx, sp, k.scopes("").Claims, batch)
	}
	if err != nil {
		k.t.Fatalf("kafkatxtest: claim idempotency keys: %v (a lock timeout: another open Tx of this test claimed the same key; see LockTimeout)", err)
	}
	if t.Verdict == engine.Wait && k.park && kafkatx.IsUnavailable(t.Err) && t.Failed >= 0 && engine.KeyFailure(t.Cause) {
		return t.Failed, &unavailableForKey{t.Cause} // parked when it runs alone (settle), no attempt spent
	}
	switch t.Verdict {
	case engine.Again, engine.Wait:
		kind := RunAgain
		if t.Verdict == engine.Wait {
			kind = Unavailable
		}
		for _, m := range batch {
			tx.outcomes = append(tx.outcomes, Outcome{Message: m, Kind: kind, Attempt: attempt(m), Err: t.Err})
		}
		return -1, nil
	case engine.Failed:
		return t.Failed, t.Cause
	}
	if err := sp.Commit(ctx); err != nil {
		k.t.Fatalf("kafkatxtest: release savepoint: %v%s", err, tx.connClosedHint())
	}
	kinds := make([]Kind, len(batch))
	for _, i := range t.Dups {
		kinds[i] = Duplicate
	}
	for _, i := range t.NotChanges {
		kinds[i] = NotAChange
	}
	for i, m := range batch {
		kind := kinds[i]
		if kind == 0 {
			kind = Committed
		}
		tx.outcomes = append(tx.outcomes, Outcome{Message: m, Kind: kind, Attempt: attempt(m)})
	}
	return -1, nil
}

// scopes are the loop's scopes of a message of topic at replay epoch 0 (engine.ScopesOf).
func (k *Kit) scopes(topic string) engine.Scopes {
	return engine.ScopesOf(k.group, 0, k.topicIDs[topic])
}

// stampSources gives each message of a try a fresh outbox source, as the loop gives the
// messages of each of its tries (engine.StampSource): the records a handler writes for a
// message get the outbox ids the loop would give them.
func (k *Kit) stampSources(batch []*kafkatx.Message) {
	srcs := make([]outbox.Source, len(batch))
	for i, m := range batch {
		engine.StampSource(&srcs[i], k.scopes(m.Topic).Sources, m.Topic, m.Partition, m.Offset)
		engine.AttachSource(m, &srcs[i])
	}
}

// keyed gives m to the idempotency key function, as the loop does.
func keyed(m *kafkatx.Message) idempotency.Message {
	return idempotency.Message{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: m.Key, Value: m.Value, Header: m.Header}
}

// settle records the failure herr of m's try: an attempt the loop retries, or its dead
// letter, written in tx as the loop writes it (engine.NewDeadLetter, engine.DeadLetterTx).
func (tx *Tx) settle(ctx context.Context, m *kafkatx.Message, herr error) {
	tx.k.t.Helper()
	k := tx.k
	if u, ok := herr.(*unavailableForKey); ok {
		o := Outcome{Message: m, Kind: Parked, Attempt: attempt(m), Err: u.cause}
		o.ErrorClass, o.ErrorMessage, o.Stack = engine.Describe(u.cause)
		tx.park(ctx, o, true)
		return
	}
	o := Outcome{Message: m, Kind: Retried, Attempt: attempt(m), Err: herr}
	o.ErrorClass, o.ErrorMessage, o.Stack = engine.Describe(herr)
	if !engine.GiveUp(o.ErrorClass, o.Attempt, k.maxAttempt) && k.park && engine.KeyFailure(herr) {
		o.Kind = Parked
		tx.park(ctx, o, false)
		return
	}
	if engine.GiveUp(o.ErrorClass, o.Attempt, k.maxAttempt) {
		var hs []dlq.Header
		for _, h := range m.Headers {
			hs = append(hs, dlq.Header{Key: h.Key, Value: h.Value})
		}
		d := engine.NewDeadLetter(k.group, keyed(m), m.Timestamp, hs,
			offsetstore.Attempt{Offset: m.Offset, Attempts: o.Attempt, ErrorClass: o.ErrorClass, ErrorMessage: o.ErrorMessage, Stack: o.Stack}, 0)
		if err := engine.DeadLetterTx(ctx, tx.Tx, k.schema, d, k.dlqTopic); err != nil {
			var tp *engine.TopicPanic
			if errors.As(err, &tp) {
				k.t.Fatalf("%v (the loop logs this at error level and retries the dead letter until the configuration is fixed)", err)
			}
			hint := tx.connClosedHint()
			if hint == "" {
				hint = " (a lock timeout: another open Tx of this test wrote the same offset's dead letter; see LockTimeout)"
			}
			k.t.Fatalf("kafkatxtest: write the dead letter of offset %d: %v%s", m.Offset, err, hint)
		}
		o.Kind, o.DeadLetter = DeadLettered, d
	}
	tx.outcomes = append(tx.outcomes, o)
}

func attempt(m *kafkatx.Message) int { return max(m.Attempt, 1) }

// unavailableForKey is a message's Unavailable answer that parks its key (Config.Park).
type unavailableForKey struct{ cause error }

func (u *unavailableForKey) Error() string { return u.cause.Error() }

// keyParked reports whether m's key was parked earlier in tx (a nil key never is: each
// nil-key message is a key of its own).
func (tx *Tx) keyParked(m *kafkatx.Message) bool {
	return tx.k.park && m.Key != nil && tx.parked[string(parking.KeyHash(m.Key, m.Offset))]
}

// park writes o.Message's row of key_parking in tx as the loop writes it — its attempts so
// far (none for an Unavailable answer or a message parked behind its key) and its error — and
// records outcome o.
func (tx *Tx) park(ctx context.Context, o Outcome, unavailable bool) {
	tx.k.t.Helper()
	m := o.Message
	h := parking.KeyHash(m.Key, m.Offset)
	pm := parking.Message{Group: tx.k.group, Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, TopicID: tx.k.topicIDs[m.Topic],
		KeyHash: h, Key: m.Key, Value: m.Value, Timestamp: m.Timestamp, ErrorClass: o.ErrorClass, LastError: o.ErrorMessage}
	if o.Err != nil && !unavailable {
		pm.Attempts = o.Attempt
	}
	if o.Err != nil {
		pm.FirstFailureAt, pm.NextTry = time.Now(), time.Now()
	}
	for _, hd := range m.Headers {
		pm.Headers = append(pm.Headers, parking.Header{Key: hd.Key, Value: hd.Value})
	}
	if err := parking.New(tx.k.schema).ParkTx(ctx, tx.Tx, pm); err != nil {
		tx.k.t.Fatalf("kafkatxtest: park offset %d: %v%s", m.Offset, err, tx.connClosedHint())
	}
	if tx.parked == nil {
		tx.parked = map[string]bool{}
	}
	tx.parked[string(h)] = true
	tx.outcomes = append(tx.outcomes, o)
}

// Outcomes returns the outcomes of every Run and RunBatch in tx, in order.
func (tx *Tx) Outcomes() []Outcome { return tx.outcomes }

// Outcome returns the latest outcome of the message at offset (of any topic and partition
// run in tx); it fails the test when no message at offset was run.
func (tx *Tx) Outcome(offset int64) Outcome {
	tx.k.t.Helper()
	for i := len(tx.outcomes) - 1; i >= 0; i-- {
		if tx.outcomes[i].Message.Offset == offset {
			return tx.outcomes[i]
		}
	}
	tx.k.t.Fatalf("kafkatxtest: no message at offset %d was run in this transaction", offset)
	return Outcome{}
}

// OutboxRecord is one record of the outbox written in the transaction: a row, or a record of
// a packed row (outbox.Writer.Pack).
type OutboxRecord struct {
	ID int64 // the outbox table's id; for a record of a packed row, the record's own (pack_ids)
	// OutboxID is the record's kafkatx-outbox-id (the outbox_id column): for a record written
	// for a message the kit ran, the id the loop would give it (outbox.SourceID).
	OutboxID uuid.UUID
	outbox.Record
}

// Outbox returns the outbox records written in tx (by the handlers, and the dead letters'
// records for their dead-letter topics) to the outbox table of the kit's schema (Kit.Schema),
// in write order. A database error fails the test. Records the code under test wrote in tx to
// the default schema's outbox ("kafkatx".outbox, an outbox.Writer without Schema) fail the test
// with that reason: they are not the kit's, and would otherwise go unseen.
func (tx *Tx) Outbox() []OutboxRecord {
	tx.k.t.Helper()
	tx.checkDefaultOutbox()
	// A packed row (outbox.Writer.Pack) holds several records, each with its own id.
	rows, err := tx.Query(tx.k.ctx(), `SELECT id, outbox_id::text, topic, key, value, header_keys, header_values, partition,
			CASE WHEN state = 'packed' THEN pack END, pack_ids
		FROM `+tables.For(tx.k.schema).Outbox+` WHERE txid = pg_current_xact_id() ORDER BY id`)
	if err != nil {
		tx.k.t.Fatalf("kafkatxtest: read the outbox: %v", err)
	}
	var recs []OutboxRecord
	for rows.Next() {
		var r OutboxRecord
		var hk, hv [][]byte
		var id string
		var packed []byte
		var ids []int64
		if err := rows.Scan(&r.ID, &id, &r.Topic, &r.Key, &r.Value, &hk, &hv, &r.Partition, &packed, &ids); err != nil {
			rows.Close()
			tx.k.t.Fatalf("kafkatxtest: read the outbox: %v", err)
		}
		if packed != nil {
			prs, err := outboxpack.Decode(packed)
			if err != nil || len(prs) != len(ids) {
				rows.Close()
				tx.k.t.Fatalf("kafkatxtest: read the outbox: packed row %d: %v (%d records, %d ids)", r.ID, err, len(prs), len(ids))
			}
			for i, p := range prs {
				pr := OutboxRecord{ID: ids[i], OutboxID: uuid.UUID(p.OutboxID)}
				pr.Topic, pr.Key, pr.Value, pr.Partition = p.Topic, p.Key, p.Value, p.Partition
				for j := range p.HK {
					pr.Headers = append(pr.Headers, outbox.Header{Key: string(p.HK[j]), Value: p.HV[j]})
				}
				recs = append(recs, pr)
			}
			continue
		}
		var err error
		if r.OutboxID, err = uuid.Parse(id); err != nil {
			rows.Close()
			tx.k.t.Fatalf("kafkatxtest: read the outbox: %v", err)
		}
		for i := range hk {
			r.Headers = append(r.Headers, outbox.Header{Key: string(hk[i]), Value: hv[i]})
		}
		recs = append(recs, r)
	}
	if err := rows.Err(); err != nil {
		tx.k.t.Fatalf("kafkatxtest: read the outbox: %v", err)
	}
	return recs
}

// DeadLetters returns the dead letters visible in tx — in the kit's fresh schema, those
// written by Run and RunBatch — oldest first. A database error fails the test.
func (tx *Tx) DeadLetters() []dlq.DeadLetter {
	tx.k.t.Helper()
	ds, err := dlq.List(tx.k.ctx(), tx, tx.k.schema, dlq.Filter{Limit: 1 << 20})
	if err != nil {
		tx.k.t.Fatalf("kafkatxtest: read the dead letters: %v", err)
	}
	return ds
}

// checkDefaultOutbox fails the test when tx holds records written to the outbox of the default
// schema "kafkatx" rather than the kit's: the code under test used outbox.Writer{} (or a
// Schema of ""), which a database with a real kafkatx schema accepts silently. The query runs
// in a savepoint, so a missing or unreadable table changes nothing.
func (tx *Tx) checkDefaultOutbox() {
	tx.k.t.Helper()
	ctx := tx.k.ctx()
	def := pg.SchemaOr("")
	if tx.k.schema == def {
		return
	}
	sp, err := tx.Tx.Begin(ctx)
	if err != nil {
		return // Outbox's own query reports the error
	}
	defer func() { _ = sp.Rollback(context.WithoutCancel(ctx)) }()
	var n int64
	if err := sp.QueryRow(ctx, `SELECT count(*) FROM `+tables.For(def).Outbox+` WHERE txid = pg_current_xact_id()`).Scan(&n); err != nil || n == 0 {
		return
	}
	tx.k.t.Errorf("kafkatxtest: the code under test wrote %d outbox records in this transaction to %s, the default schema's outbox, "+
		"not to the kit's schema %q: pass outbox.Writer{Schema: k.Schema()} (the schema your Config.Schema names in production) to the code under test",
		n, tables.For(def).Outbox, tx.k.schema)
}
