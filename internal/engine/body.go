package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/dlq"
	"github.com/kafkatx/kafkatx/idempotency"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/limit"
)

// Body is the transaction body: what runs inside one database transaction for a contiguous run
// of one partition's messages — the claim of their business idempotency keys, the handler call
// and the sorting of its answer, and, on a failure, which message failed. The loop's partition
// worker (TryRecords) and the test kit kafkatxtest (Try) run this one code; what follows it
// (attempt rows, the watermark's compare-and-set, COMMIT, the Kafka commit) is the worker's,
// and the kit's stand-in for it is a transaction it rolls back. M is the handler's message
// type (*kafkatx.Message).
type Body[M any] struct {
	// Handler runs msgs in tx: the user's BatchHandler with its middleware.
	Handler func(ctx context.Context, tx pgx.Tx, msgs []M) error
	// Keyed gives a message to the idempotency key function; its Offset names the message.
	Keyed func(M) idempotency.Message
	// Claims claims business idempotency keys; nil when Config.Idempotency.Disabled.
	Claims *Claims
	// FromKafka converts the polled records of one try for the handler (the loop's; nil in
	// the kit), each message given its idempotency scope ("group/epoch"), from which the
	// outbox ids of the records written for it are derived (outbox.Source).
	FromKafka func(kms []*kafka.Message, attempt int, scope string) []M
	// Prepare, when set (Config.Prepare), runs on the messages before their transaction
	// begins, outside any transaction: a slow call to another service that must not hold a
	// pooled connection. Its answer is sorted as the handler's is.
	Prepare func(ctx context.Context, msgs []M) error
	// PrepareLimit, when set (Config.PrepareLimit), bounds the Prepare calls in flight over
	// every worker: Prepared waits for a permit before calling Prepare.
	PrepareLimit *limit.Limiter
}

// Claims is where and how Body claims business idempotency keys.
type Claims struct {
	Store idempotency.Store
	Key   idempotency.KeyFunc
}

// Unattributed is Tried.Failed for a batch that failed without naming its message.
const Unattributed = -2

// Tried is what one try of Body did.
type Tried struct {
	// Verdict is Sort's: Done (commit), Again (roll back, run again, not an attempt), Wait
	// (an Unavailable answer) or Failed (an attempt).
	Verdict Verdict
	// Err is the handler's answer (for a key function's failure, that failure).
	Err error
	// Failed is, for Failed and Wait, the index of the failing message or Unattributed;
	// else -1. Cause is that message's own error (a wrapper naming the message removed).
	Failed int
	Cause  error
	// Fresh counts the messages the handler ran on; Dups and NotChanges are the indexes of
	// those it skipped (a business key claimed before; idempotency.ErrNotAChange).
	Fresh            int
	Dups, NotChanges []int
}

// Try claims msgs' business keys in tx under scope ("group/epoch"), runs the handler on the
// fresh ones and sorts its answer. A key function error fails its message as permanent (a
// *Panic of the key function stays a panic: an attempt); a handler error naming its message
// (a method FailedOffset() int64, as *kafkatx.MessageError has) fails that one; any other
// failure of a batch of one fails it; of a longer batch is Unattributed. err is a database
// error of the claim (the caller runs the transaction again).
func (b *Body[M]) Try(ctx context.Context, tx pgx.Tx, scope string, msgs []M) (t Tried, err error) {
	t.Failed = -1
	fresh := msgs
	if b.Claims != nil {
		keyed := make([]idempotency.Message, len(msgs))
		for i, m := range msgs {
			keyed[i] = b.Keyed(m)
		}
		cl, failed, kerr, err := ClaimKeys(ctx, tx, b.Claims.Store, scope, b.Claims.Key, keyed)
		if err != nil {
			return t, err
		}
		if kerr != nil {
			var pe *Panic
			if !errors.As(kerr, &pe) {
				kerr = &permanent{err: kerr}
			}
			return Tried{Verdict: Failed, Err: kerr, Failed: failed, Cause: kerr}, nil
		}
		t.Dups, t.NotChanges = cl.Dups, cl.NotChanges
		if len(cl.Fresh) != len(msgs) {
			fresh = make([]M, len(cl.Fresh))
			for j, i := range cl.Fresh {
				fresh[j] = msgs[i]
			}
		}
	}
	t.Fresh = len(fresh)
	if len(fresh) == 0 {
		return t, nil // every message was a duplicate by its business key
	}
	herr := CallTx(tx, func(htx pgx.Tx) error { return b.Handler(ctx, htx, fresh) })
	t.Verdict, t.Err = Sort(ctx, tx, herr)
	if t.Verdict == Failed || t.Verdict == Wait {
		t.Failed, t.Cause = b.attribute(msgs, t.Err)
	}
	return t, nil
}

// attribute names the message of msgs that herr is the failure of: the one whose offset a
// method FailedOffset() int64 of herr's chain names (*kafkatx.MessageError has one), with the
// error it wraps; else the only one of a batch of one; else Unattributed.
func (b *Body[M]) attribute(msgs []M, herr error) (int, error) {
	var named interface {
		FailedOffset() int64
		Unwrap() error
	}
	if errors.As(herr, &named) {
		for i, m := range msgs {
			if b.Keyed(m).Offset == named.FailedOffset() {
				return i, named.Unwrap()
			}
		}
		if len(msgs) == 1 {
			return 0, named.Unwrap()
		}
	}
	if len(msgs) == 1 {
		return 0, herr
	}
	return Unattributed, herr
}

// Prepared runs Prepare (if set) on msgs outside any transaction and sorts its answer as the
// handler's: a Tried whose Verdict is Done when there is nothing to prepare or it succeeded.
func (b *Body[M]) Prepared(ctx context.Context, msgs []M) Tried {
	t := Tried{Failed: -1}
	if b.Prepare == nil {
		return t
	}
	var permit *limit.Permit
	if b.PrepareLimit != nil {
		var err error
		if permit, err = b.PrepareLimit.Acquire(ctx); err != nil {
			return Tried{Verdict: Again, Err: err, Failed: -1} // ctx ended while waiting
		}
	}
	perr := Call(func() error { return b.Prepare(ctx, msgs) })
	t.Verdict, t.Err = Sort(ctx, nil, perr)
	if t.Verdict == Failed || t.Verdict == Wait {
		t.Failed, t.Cause = b.attribute(msgs, t.Err)
	}
	permit.DoneKey(prepareOutcome(ctx, t.Verdict), b.prepareKey(msgs, t))
	return t
}

// prepareKey is the record key a Prepare call that answered t was for, for its limit (package
// limit: one key's refusals do not shrink the limit for every key): the message an Unavailable
// answer named — not the database's own condition, which is no key's — or the only message of
// a success; else nil (no key: a refusal counts for everyone).
func (b *Body[M]) prepareKey(msgs []M, t Tried) []byte {
	switch {
	case b.Keyed == nil:
	case t.Verdict == Wait && t.Failed >= 0:
		if _, server := ServerCondition(t.Err); !server {
			return b.Keyed(msgs[t.Failed]).Key
		}
	case t.Verdict == Done && len(msgs) == 1:
		return b.Keyed(msgs[0]).Key
	}
	return nil
}

// prepareOutcome is how a Prepare call answered with verdict v went, for its limit: Wait (the
// far side Unavailable, or the database's own condition) as dropped, Done as a latency sample,
// anything else — ctx ended, the handler-style failure of one message — as saying nothing of
// the far side's speed.
func prepareOutcome(ctx context.Context, v Verdict) limit.Outcome {
	switch {
	case ctx.Err() != nil:
		return limit.Ignored
	case v == Done:
		return limit.Success
	case v == Wait:
		return limit.Dropped
	}
	return limit.Ignored
}

// TryRecords runs, for records the loop polled (converted with FromKafka at attempt), the
// prepare phase outside any transaction, then — when it succeeded — opens a transaction with
// begin and runs Try in it. tx is that transaction (nil when none was opened), for the caller
// to finish or roll back; err is begin's or the claim's database error.
func (b *Body[M]) TryRecords(ctx context.Context, begin func(context.Context) (pgx.Tx, error), scope Scopes, kms []*kafka.Message, attempt int) (tx pgx.Tx, t Tried, err error) {
	msgs := b.FromKafka(kms, attempt, scope.Sources)
	if t = b.Prepared(ctx, msgs); t.Verdict != Done {
		return nil, t, nil
	}
	if tx, err = begin(ctx); err != nil {
		return nil, t, fmt.Errorf("begin: %w", err)
	}
	t, err = b.Try(ctx, tx, scope.Claims, msgs)
	return tx, t, err
}

// Scopes are the two scopes of a partition's messages: Claims, of their business idempotency
// keys ("group/epoch"), and Sources, of the outbox ids derived from them ("group/epoch/topic
// id"; "group/epoch" when the topic id is unknown).
type Scopes struct {
	Claims  string
	Sources string
}

// Runner is the part of Body the partition worker uses.
type Runner interface {
	TryRecords(ctx context.Context, begin func(context.Context) (pgx.Tx, error), scope Scopes, kms []*kafka.Message, attempt int) (pgx.Tx, Tried, error)
}

// NewDeadLetter is the dead letter of a message given up on after attempt a: the message's
// bytes, position and headers, and a's count, class, message, stack and failure times. A
// failure whose class is unknown (the process stopped during the try) is ClassCrash; missing
// failure times are now.
func NewDeadLetter(group string, m idempotency.Message, ts time.Time, headers []dlq.Header, a offsetstore.Attempt, epoch int) *dlq.DeadLetter {
	now := time.Now()
	d := &dlq.DeadLetter{
		Group: group, Topic: m.Topic, Partition: m.Partition, Offset: m.Offset,
		Key: m.Key, Value: m.Value, Timestamp: ts, Headers: headers,
		Attempts: a.Attempts, ErrorClass: a.ErrorClass, ErrorMessage: a.ErrorMessage, Stack: a.Stack,
		FirstFailureAt: a.FirstFailureAt, LastFailureAt: a.LastFailureAt, ReplayEpoch: epoch,
	}
	if d.ErrorClass == "" {
		d.ErrorClass = ClassCrash
		d.ErrorMessage = fmt.Sprintf("the process stopped (crash or kill) while the handler ran; %d attempts did not finish", a.Attempts)
	}
	if d.FirstFailureAt.IsZero() {
		d.FirstFailureAt = now
	}
	if d.LastFailureAt.IsZero() {
		d.LastFailureAt = now
	}
	return d
}

// DeadLetterTx writes dead letter d in tx and, when topicOf is not nil (Config.DeadLetter.Topic;
// nil keeps dead letters in the database only), its record for topicOf(d.Topic) through the
// outbox (WriteDeadLetter). A panic of topicOf is returned as an error (*TopicPanic): the loop
// logs it and runs the dead letter again until the configuration is fixed; the kit fails the
// test.
func DeadLetterTx(ctx context.Context, tx pgx.Tx, schema string, d *dlq.DeadLetter, topicOf func(string) string) error {
	topic := ""
	if topicOf != nil {
		var err error
		if topic, err = deadLetterTopic(topicOf, d.Topic); err != nil {
			return err
		}
	}
	return WriteDeadLetter(ctx, tx, schema, d, topic)
}

// TopicPanic is DeadLetterTx's error when Config.DeadLetter.Topic panicked.
type TopicPanic struct {
	Topic string
	Value any
}

func (e *TopicPanic) Error() string {
	return fmt.Sprintf("kafkatx: Config.DeadLetter.Topic panicked for topic %q: %v", e.Topic, e.Value)
}

func deadLetterTopic(f func(string) string, topic string) (dlqTopic string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &TopicPanic{Topic: topic, Value: r}
		}
	}()
	return f(topic), nil
}
