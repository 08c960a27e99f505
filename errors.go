package kafkatx

import (
	"errors"
	"fmt"
	"strings"

	"github.com/kafkatx/kafkatx/internal/engine"
	"github.com/kafkatx/kafkatx/internal/offsetstate"
	"github.com/kafkatx/kafkatx/internal/tables"
)

// Every exported error type of package kafkatx. The control errors a handler returns —
// Permanent, FailMessage, Unavailable — are recognised by the loop through a method
// (Permanent, FailedOffset, Unavailable), so any error with that method is treated alike.

// PermanentError marks a handler error as not worth retrying: the message is dead-lettered
// at once. Create one with Permanent and detect one with errors.As.
type PermanentError struct {
	Err error
}

func (e *PermanentError) Error() string { return "permanent: " + e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent reports true: the loop dead-letters the message at once (engine.PermanentCause).
func (e *PermanentError) Permanent() bool { return true }

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

// MessageError names the message of a batch that failed. Create one with FailMessage.
type MessageError struct {
	Offset int64
	Err    error
}

func (e *MessageError) Error() string { return fmt.Sprintf("offset %d: %v", e.Offset, e.Err) }
func (e *MessageError) Unwrap() error { return e.Err }

// FailedOffset is the offset of the message that failed: the loop finds the message by it.
func (e *MessageError) FailedOffset() int64 { return e.Offset }

// FailMessage ties err to message m of a batch, so that only m is retried or
// dead-lettered. Wrap err with Permanent to dead-letter m at once.
func FailMessage(m *Message, err error) error {
	if err == nil {
		return nil
	}
	return &MessageError{Offset: m.Offset, Err: err}
}

// UnavailableError is a handler error saying that a dependency outside the message is
// unavailable — an API that refuses the service's credentials, a downstream resource that does
// not exist yet, a server that is down — so the failure is not a property of the message and
// must not count against it. Create one with Unavailable and detect one with errors.As.
//
// Like River's JobSnooze, it is a control error: returned by a handler (directly, wrapped, or
// inside FailMessage), it tells the loop what to do rather than what went wrong. Any error with
// a method Unavailable() bool that returns true is treated alike (IsUnavailable). The loop then
//
//   - rolls the message's transaction back (nothing of the try is kept, no attempt is
//     recorded, no dead letter written);
//   - waits outside any transaction, pausing only the message's partition, with exponential
//     backoff from Config.Retry.InitialBackoff capped at 10 s (UnavailableMaxBackoff);
//   - runs the same message again, and again, until it succeeds or fails otherwise;
//   - once the partition has waited Config.UnavailableMaxWait for one message, treats the
//     next Unavailable answer as an ordinary failure (an attempt, retried per Config.Retry and
//     dead-lettered after MaxAttempts).
//
// Each wait is logged at warn level with its cause, counted in the
// kafkatx_dependency_unavailable_total metric, and shows in Stats.Waiting and the
// kafkatx_partition_waiting gauge while it lasts; the messages held count in Stats.InFlight,
// so a consumer with a waiting partition is never idle. A crash during the wait costs what a
// crash during a database retry costs: the in-progress try counts once.
type UnavailableError struct {
	Err error
}

func (e *UnavailableError) Error() string { return "dependency unavailable: " + e.Err.Error() }
func (e *UnavailableError) Unwrap() error { return e.Err }

// Unavailable wraps err, the reason a dependency outside the message cannot serve it now, so
// that the consumer waits and retries the message without counting an attempt (see
// UnavailableError). Unavailable(nil) returns nil.
func Unavailable(err error) error {
	if err == nil {
		return nil
	}
	return &UnavailableError{Err: err}
}

// IsUnavailable reports whether err or an error it wraps is an *UnavailableError, or has a
// method Unavailable() bool that returns true — so a client package can mark its failures
// without importing kafkatx (idempotency/airflow does; like net.Error's Timeout). The loop uses
// it to recognise a handler's Unavailable answer.
func IsUnavailable(err error) bool { return engine.IsUnavailable(err) }

// Unavailable reports true: an *UnavailableError is one by construction.
func (e *UnavailableError) Unavailable() bool { return true }

// Error classes stored with attempts and dead letters, and sent in the
// kafkatx.dlq.error.class header.
const (
	ErrorClassPermanent = engine.ClassPermanent // the handler returned Permanent(err)
	ErrorClassHandler   = engine.ClassHandler   // the handler returned an error, retried until max attempts
	ErrorClassPanic     = engine.ClassPanic     // the handler panicked
	ErrorClassCrash     = engine.ClassCrash     // the process stopped (crash, SIGKILL) while the handler ran
	ErrorClassOversized = engine.ClassOversized // the value exceeded Config.MaxValueBytes; the handler never ran
)

// ErrTxOwnedByLoop is what Commit and Rollback return on the pgx.Tx a Handler, BatchHandler or
// Middleware is given: the transaction also holds the watermark advance and the dead letters,
// and only the loop commits it (after the handler returns nil) or rolls it back (after an
// error). The call does nothing else; the try is the handler's failure — an attempt, retried
// and dead-lettered after Config.Retry.MaxAttempts — even when the handler ignores the error
// and returns nil. tx.Begin (a savepoint) and every other method work as in pgx.
var ErrTxOwnedByLoop = engine.ErrTxOwnedByLoop

// MigrationsMissingError is Run's error when Config.SkipMigrations is set and Schema lacks
// migrations this build of kafkatx needs.
type MigrationsMissingError struct {
	Schema  string
	Missing []int // versions not recorded in Schema.schema_migrations, in order
}

func (e *MigrationsMissingError) Error() string {
	return fmt.Sprintf("kafkatx: schema %q lacks migrations %v (Config.SkipMigrations is set): apply them with `kafkatx migrate up --schema %s` or Migrate",
		e.Schema, e.Missing, tables.For(e.Schema).QuotedSchema)
}

// LogRangeError is returned by Run when a partition's database watermark is past the end of
// its log: records kafkatx processed are no longer in it. With the topic's id the one recorded
// with the watermark (TopicID set), the same topic's log was truncated — an unclean leader
// election (unclean.leader.election.enable) made a replica that lacked them the leader, and
// records written since may take those offsets again; without a recorded id (a watermark
// older than topic ids) the topic may also have been deleted and created again. A topic id
// that differs is a *LogChangedError instead. Nothing is processed: replay the log with
// `kafkatx offsets reset --to-earliest --mode replay`, or skip to its end with `--to-latest
// --mode skip`.
type LogRangeError struct {
	// Schema holds the consumer's tables (Config.Schema), named in the printed command.
	Schema           string
	Group            string
	Topic            string
	Partition        int32
	Watermark        int64 // the database's next offset to process
	LogStart, LogEnd int64 // the partition's log start and end offsets
	// TopicID is the topic's id, recorded with the watermark and the same now ("" unknown).
	TopicID string
}

func (e *LogRangeError) Error() string {
	what := "the topic was recreated (before kafkatx recorded topic ids) or its log truncated by an unclean leader election"
	if e.TopicID != "" {
		what = fmt.Sprintf("the topic is the same one (topic id %s, as recorded), so its log was truncated: most likely an unclean leader election "+
			"(unclean.leader.election.enable) made a replica that lacked those records the leader, and records written since may take their offsets again", e.TopicID)
	}
	return fmt.Sprintf("kafkatx: group %q %s[%d]: the log now ends at offset %d (log start %d), below the database watermark %d: records [%d, %d) that kafkatx processed are no longer in it; "+
		"%s. kafkatx cannot tell which records at those offsets are new, so it processed nothing. With the consumer stopped, process the log again from its start with "+
		"`%s --to-earliest --mode replay --reason TEXT --execute` "+
		"or skip to its end with `--to-latest --mode skip`",
		e.Group, e.Topic, e.Partition, e.LogEnd, e.LogStart, e.Watermark, e.LogEnd, e.Watermark, what, resetCommand(e.Schema, e.Group, e.Topic, e.Partition))
}

// resetCommand is offsetstate.ResetCommand with shellWord: the start of the `kafkatx offsets
// reset` a halt's error prints, naming the consumer's schema.
func resetCommand(schema, group, topic string, partition int32) string {
	return offsetstate.ResetCommand(schema, group, topic, partition, shellWord)
}

// shellWord quotes s for a command suggested in an error: as is when plain, else in single
// quotes (group ids and topic names may hold characters a shell would act on).
func shellWord(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// OffsetAheadError is returned by Run under AheadHalt when Kafka's committed offset is
// ahead of the database watermark (a database restored from an older backup, or an offset
// moved with Kafka's own tools).
type OffsetAheadError struct {
	Schema    string // Config.Schema, named in the printed commands
	Group     string
	Topic     string
	Partition int32
	Watermark int64 // the database's next offset to process
	Committed int64 // Kafka's committed offset
}

func (e *OffsetAheadError) Error() string {
	return fmt.Sprintf("kafkatx: group %q %s[%d]: Kafka committed offset %d is ahead of the database watermark %d; policy is halt: "+
		"nothing processed. With the consumer stopped, align Kafka to the database with `%s --to-database --reason TEXT --execute` "+
		"(the records [%d, %d) run), or skip them with `%s --to-offset %d --mode skip --reason TEXT --execute`",
		e.Group, e.Topic, e.Partition, e.Committed, e.Watermark, resetCommand(e.Schema, e.Group, e.Topic, e.Partition),
		e.Watermark, e.Committed, resetCommand(e.Schema, e.Group, e.Topic, e.Partition), e.Committed)
}

// NotReadyError is Ready's error: the Readiness that was not ready.
type NotReadyError struct{ Readiness Readiness }

func (e *NotReadyError) Error() string {
	return "kafkatx: consumer not ready: " + strings.Join(e.Readiness.Reasons, "; ")
}

// LogChangedError is returned by Run when the log behind a partition's watermark is another
// one: the topic's id (KIP-516) or the cluster's id differs from the one recorded with the
// watermark — the topic was deleted and created again under the same name, or the brokers are
// another cluster (a disaster-recovery switch, a rebuilt cluster). The watermark's offsets
// mean nothing in the new log, so kafkatx neither starts there (it would skip the new log's
// first records) nor anywhere else on its own; nothing is processed. Adopt the new log with
// `kafkatx offsets reset --mode adopt` (from its earliest offset, latest, or a time), or set
// Config.OnLogChange. An id that is "" was not known.
type LogChangedError struct {
	Schema    string // Config.Schema, named in the printed command
	Group     string
	Topic     string
	Partition int32
	Watermark int64 // the database's next offset to process, in the old log
	// RecordedTopicID and RecordedClusterID are the ids recorded with the watermark; TopicID
	// and ClusterID the ones the broker gives now.
	RecordedTopicID, TopicID     string
	RecordedClusterID, ClusterID string
	LogStart, LogEnd             int64 // the new log's start and end offsets (-1: not read)
	// Running is set when the consumer found the change while it ran (a check every 5 s)
	// rather than at an assignment: then the records [AppliedFrom, Watermark) were applied
	// after the last check that still saw the old log, and some of them may be the new log's
	// (none when AppliedFrom == Watermark). docs/offsets.md, "A topic recreated while the
	// consumer runs".
	Running     bool
	AppliedFrom int64
	// MovedAway is set when the watermark row itself was moved onto another log while this
	// consumer ran (its compare-and-set refused): RecordedTopicID/RecordedClusterID are then
	// the log the row counts now — adopted by another consumer (one reading another cluster
	// behind the same group and topic name, whose group Kafka does not show to this one) or
	// by `kafkatx offsets reset --mode adopt` — and TopicID/ClusterID this consumer's own log
	// (ClusterID "" when not read). Nothing of this consumer's log was applied under the
	// other log's offsets.
	MovedAway bool
}

func (e *LogChangedError) Error() string {
	c := offsetstate.CompareLog(offsetstate.LogID{Cluster: e.RecordedClusterID, Topic: e.RecordedTopicID},
		offsetstate.LogID{Cluster: e.ClusterID, Topic: e.TopicID})
	if e.MovedAway {
		return fmt.Sprintf("kafkatx: group %q %s[%d]: the watermark was moved onto another log while this consumer ran: it now counts topic id %s "+
			"(cluster id %s) at %d, and this consumer reads topic id %s. Another consumer adopted that log — one reading another Kafka cluster "+
			"behind the same group and topic name, or `kafkatx offsets reset --mode adopt` — so this one stopped, having applied nothing of its "+
			"own log under the other log's offsets. One group's watermarks count one log: stop the consumers of one of the two clusters, "+
			"or give them their own --group or schema",
			e.Group, e.Topic, e.Partition, orUnknown(e.RecordedTopicID), orUnknown(e.RecordedClusterID), e.Watermark, orUnknown(e.TopicID))
	}
	if e.Running && e.AppliedFrom < e.Watermark {
		return fmt.Sprintf("kafkatx: group %q %s[%d]: the log behind the watermark changed while the consumer ran: %s. The consumer stopped; "+
			"offsets [%d, %d) were applied after the last check that still saw the old log and may be records of the new log: check them "+
			"(kafkatx offsets audit shows this halt with the range). Then, with the consumer stopped, adopt the new log with "+
			"`%s --mode adopt --to-earliest --reason TEXT --execute` (that runs those offsets of the new log "+
			"again: the handler's idempotency decides) or --to-offset N, or set Config.OnLogChange (--on-log-change in the examples)",
			e.Group, e.Topic, e.Partition, c.What(), e.AppliedFrom, e.Watermark, resetCommand(e.Schema, e.Group, e.Topic, -1))
	}
	logRange := "" // -1: not read (the running check reads ids only)
	if e.LogStart >= 0 && e.LogEnd >= 0 {
		logRange = fmt.Sprintf(" (log [%d, %d))", e.LogStart, e.LogEnd)
	}
	return fmt.Sprintf("kafkatx: group %q %s[%d]: the log behind the watermark changed: %s. The watermark %d counts offsets of the old log "+
		"and means nothing in the new one%s: kafkatx will not start at it there (it would skip or mix up records) and processed nothing. "+
		"With the consumer stopped, adopt the new log from its start with `%s --mode adopt --to-earliest --reason TEXT --execute` "+
		"(or --to-latest, --to-time), or set Config.OnLogChange (--on-log-change in the examples)",
		e.Group, e.Topic, e.Partition, c.What(), e.Watermark, logRange, resetCommand(e.Schema, e.Group, e.Topic, -1))
}

// haltError is the error Run returns for reconciliation's halt h of the consumer whose tables
// are in schema.
func haltError(schema string, h engine.Halt) error {
	if h.State == string(offsetstate.LogChanged) {
		c := h.LogChange
		return &LogChangedError{Schema: schema, Group: h.Group, Topic: h.Topic, Partition: h.Partition, Watermark: h.Watermark,
			RecordedTopicID: c.Recorded.Topic, TopicID: c.Current.Topic, RecordedClusterID: c.Recorded.Cluster, ClusterID: c.Current.Cluster,
			LogStart: h.LogStart, LogEnd: h.LogEnd, Running: h.Running, AppliedFrom: h.AppliedFrom, MovedAway: h.MovedAway}
	}
	if h.State == string(offsetstate.WatermarkPastLogEnd) {
		return &LogRangeError{Schema: schema, Group: h.Group, Topic: h.Topic, Partition: h.Partition, Watermark: h.Watermark, LogStart: h.LogStart, LogEnd: h.LogEnd,
			TopicID: h.LogChange.Recorded.Topic}
	}
	return &OffsetAheadError{Schema: schema, Group: h.Group, Topic: h.Topic, Partition: h.Partition, Watermark: h.Watermark, Committed: h.Committed}
}

// orUnknown is id, or "unknown" when empty.
func orUnknown(id string) string {
	if id == "" {
		return "unknown"
	}
	return id
}
