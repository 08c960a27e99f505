package kafkatx

import (
	"fmt"
	"time"
)

// Hook is a value given in Config.Hooks. It implements one or more of the Hook* interfaces
// below, each with one method for one event of the loop, in the manner of franz-go's hooks
// (its Prometheus plugin kprom is such a hook; kafkatx's own Prometheus metrics are one too):
// a hook implements only the events it wants, and a new event is a new interface, so adding
// one never breaks a hook. NewConsumer refuses a Hook that implements none of them.
//
// Hooks are called synchronously from the loop's goroutines (the poll loop and the partition
// workers, several at once), after the event happened: they must be safe for concurrent use,
// return quickly and not block (hand slow work to a goroutine of your own). A panic in a hook
// is recovered and logged at error level; it changes nothing in the loop. Events carry no
// message keys or values.
type Hook any

// HookBatchCommitted is called after each transaction that ran the handler committed and
// moved the watermark.
type HookBatchCommitted interface {
	OnBatchCommitted(BatchCommitted)
}

// BatchCommitted describes one committed transaction of a partition: the watermark moved from
// FirstOffset to NextOffset over messages whose handler effects committed (Processed) or that
// were committed past without running the handler (Duplicates by business idempotency key,
// NotChanges by idempotency.ErrNotAChange).
type BatchCommitted struct {
	Group       string
	Topic       string
	Partition   int32
	FirstOffset int64 // offset of the transaction's first message
	NextOffset  int64 // the new watermark: the next offset to process
	Processed   int
	Duplicates  int
	NotChanges  int
	// Duration is the time from the transaction's BEGIN to its COMMIT's answer (one try).
	Duration time.Duration
}

// HookRedeliveryDropped is called when messages arrive that are below the partition's
// watermark (redelivered after a rebalance, a fence or a lost Kafka commit): they are
// dropped without running the handler.
type HookRedeliveryDropped interface {
	OnRedeliveryDropped(RedeliveryDropped)
}

// RedeliveryDropped counts messages of a partition dropped as already processed.
type RedeliveryDropped struct {
	Group     string
	Topic     string
	Partition int32
	Count     int
}

// HookRetryScheduled is called when a failed message is about to wait its backoff before
// its next try (Config.Retry). It is not called for database errors, which are retried
// without an attempt.
type HookRetryScheduled interface {
	OnRetryScheduled(RetryScheduled)
}

// RetryScheduled describes a retry: the message at Offset failed Attempt tries (crashes
// included), the last with ErrorClass; try Attempt+1 runs after Backoff.
type RetryScheduled struct {
	Group      string
	Topic      string
	Partition  int32
	Offset     int64
	Attempt    int
	ErrorClass string
	Backoff    time.Duration
}

// HookDeadLettered is called after a message's dead letter committed with its watermark
// advance (and its dead-letter record in the outbox, unless Config.DeadLetter.Disabled).
type HookDeadLettered interface {
	OnDeadLettered(DeadLettered)
}

// DeadLettered describes a dead letter. ErrorClass is one of the ErrorClass* constants.
type DeadLettered struct {
	Group      string
	Topic      string
	Partition  int32
	Offset     int64
	Attempts   int
	ErrorClass string
}

// HookFenced is called when a partition's watermark update found another owner had moved it
// (invariant 6, compare-and-set): the transaction rolled back and the worker re-reads the
// watermark and resumes from it.
type HookFenced interface {
	OnFenced(Fenced)
}

// Fenced describes a fenced watermark update: Expected is the watermark this member held,
// Watermark the one it re-read from the database.
type Fenced struct {
	Group     string
	Topic     string
	Partition int32
	Expected  int64
	Watermark int64
}

// HookPartitionReconciled is called for each newly assigned partition once its database
// watermark and Kafka's committed offset were compared (docs/offsets.md), including a
// comparison that halts the consumer.
type HookPartitionReconciled interface {
	OnPartitionReconciled(PartitionReconciled)
}

// PartitionReconciled describes one partition's reconciliation: Drift is Kafka's committed
// offset minus the database watermark once the decision is applied — 0 when they agree or
// kafkatx aligned them (Kafka behind is re-committed, Kafka ahead is followed and audited,
// reported by HookOffsetsSkipped), K − W when the consumer halts (Config.OnKafkaAhead
// AheadHalt, Halted true); Start is the offset the worker starts at (meaningless when
// Halted).
type PartitionReconciled struct {
	Group     string
	Topic     string
	Partition int32
	Drift     int64
	Start     int64
	Halted    bool
}

// HookPartitionsAssigned is called after a rebalance gave this member partitions and their
// workers started.
type HookPartitionsAssigned interface {
	OnPartitionsAssigned(PartitionsAssigned)
}

// PartitionsAssigned lists the partitions added to this member, each with its start offset.
type PartitionsAssigned struct {
	Group      string
	Partitions []PartitionOffset
}

// PartitionOffset is a partition with an offset: a start offset when assigned, the
// database watermark when revoked.
type PartitionOffset struct {
	Topic     string
	Partition int32
	Offset    int64
}

// HookPartitionsRevoked is called after partitions were taken from this member (a
// rebalance, or Run stopping) and their workers stopped.
type HookPartitionsRevoked interface {
	OnPartitionsRevoked(PartitionsRevoked)
}

// PartitionsRevoked lists the revoked partitions with their final watermarks. Lost is true
// when the group moved on without this member (its in-flight transactions were aborted).
type PartitionsRevoked struct {
	Group      string
	Partitions []PartitionOffset
	Lost       bool
}

// HookOffsetsSkipped is called when offsets were skipped with an audit row: following
// Kafka's committed offset ahead of the watermark, or records removed by retention before
// they were processed.
type HookOffsetsSkipped interface {
	OnOffsetsSkipped(OffsetsSkipped)
}

// OffsetsSkipped describes the skipped range [From, To). Kind is the audit kind:
// "operator_skip" (a kafkatx command recorded the move) or "unexplained_skip".
type OffsetsSkipped struct {
	Group     string
	Topic     string
	Partition int32
	From, To  int64
	Kind      string
}

// HookRollbackReplayed is called when the database lost a range of a partition that the
// consumer had committed — a failover to a standby that lacked the last transactions, a
// point-in-time restore — and the consumer re-processes it from the database's watermark
// (audit kind "rollback_replayed", docs/offsets.md "Database rollbacks").
type HookRollbackReplayed interface {
	OnRollbackReplayed(RollbackReplayed)
}

// RollbackReplayed describes the range [From, To) re-processed after a database rollback.
type RollbackReplayed struct {
	Group     string
	Topic     string
	Partition int32
	From, To  int64
}

// HookDependencyUnavailable is called for each handler answer of Unavailable that the
// partition waits out (no attempt counted).
type HookDependencyUnavailable interface {
	OnDependencyUnavailable(DependencyUnavailable)
}

// DependencyUnavailable describes one Unavailable answer for the message at Offset: the
// partition has waited since Since and tries again after Backoff.
type DependencyUnavailable struct {
	Group     string
	Topic     string
	Partition int32
	Offset    int64
	Since     time.Time
	Backoff   time.Duration
}

// HookDependencyAvailable is called when a partition's wait for an unavailable dependency
// ends: the message it held committed, was dead-lettered or failed otherwise, or the worker
// stopped.
type HookDependencyAvailable interface {
	OnDependencyAvailable(DependencyAvailable)
}

// DependencyAvailable describes the end of a partition's wait that began at Since.
type DependencyAvailable struct {
	Group     string
	Topic     string
	Partition int32
	Since     time.Time
}

// HookPartitionLag is called about once a second for each assigned partition whose log
// end offset the client knows.
type HookPartitionLag interface {
	OnPartitionLag(PartitionLag)
}

// PartitionLag is a partition's log end offset minus its database watermark, in messages.
type PartitionLag struct {
	Group     string
	Topic     string
	Partition int32
	Watermark int64
	LogEnd    int64
	Lag       int64
}

// HookPartitionPaused is called when a partition stops fetching because the messages held
// for it exceed its share of Config.MaxBufferedBytes.
type HookPartitionPaused interface {
	OnPartitionPaused(PartitionPaused)
}

// PartitionPaused describes a paused partition and the bytes it held.
type PartitionPaused struct {
	Group     string
	Topic     string
	Partition int32
	Bytes     int64
}

// HookBreakerChanged is called when the breaker (Config.Breaker) opens — messages of the
// consumer failed alike with no success between, and the partitions they hold pause and probe
// — and when it closes again.
type HookBreakerChanged interface {
	OnBreakerChanged(BreakerChanged)
}

// BreakerChanged describes the breaker when it opened (Open) or closed: since when it was
// open, what the failures share (Signature, SQLState), one failure's text (Example, sanitized,
// at most 512 bytes), how many distinct messages failed alike, and the partitions it held
// ("topic[partition]"), as Readiness.Breaker reports them.
type BreakerChanged struct {
	Group      string
	Open       bool
	Since      time.Time
	Signature  string
	SQLState   string
	Example    string
	Messages   int
	Partitions []string
}

// HookHandlerStuck is called when a partition's handler call runs past its bound
// (Config.Transaction's statement plus idle-in-transaction timeouts, Stuck true), and when
// such a call returns (Stuck false).
type HookHandlerStuck interface {
	OnHandlerStuck(HandlerStuck)
}

// HandlerStuck describes the handler call of the transaction starting at Offset, running
// since Since.
type HandlerStuck struct {
	Group     string
	Topic     string
	Partition int32
	Offset    int64
	Since     time.Time
	Stuck     bool
}

// HookPartitionStalled is called when a partition with lag (its log end past its watermark)
// has not moved its watermark for Config.StallAfter, whatever the cause (Stalled true), and
// when it moves again (Stalled false).
type HookPartitionStalled interface {
	OnPartitionStalled(PartitionStalled)
}

// PartitionStalled describes a partition's watermark and log end offset when it stalled or
// moved again.
type PartitionStalled struct {
	Group     string
	Topic     string
	Partition int32
	Watermark int64
	LogEnd    int64
	Stalled   bool
}

// HookLogChanged is called when the log behind a partition's watermark is another one (the
// topic deleted and recreated, another cluster behind the same bootstrap address; found at an
// assignment or by the running check) and the consumer halted on it (*LogChangedError) or
// adopted the new log (Config.OnLogChange, Adopted), and when the watermark row was moved onto
// another log under the running consumer (*LogChangedError with MovedAway).
type HookLogChanged interface {
	OnLogChanged(LogChanged)
}

// LogChanged names the log the watermark was recorded in (RecordedTopicID,
// RecordedClusterID) and the one the consumer reads (TopicID, ClusterID); an id is "" when
// not known.
type LogChanged struct {
	Group                        string
	Topic                        string
	Partition                    int32
	RecordedTopicID, TopicID     string
	RecordedClusterID, ClusterID string
	Adopted                      bool
}

// hookSet is Config.Hooks sorted by interface once, so that an event costs one loop over
// the hooks that want it.
type hookSet struct {
	batchCommitted []HookBatchCommitted
	redelivery     []HookRedeliveryDropped
	retry          []HookRetryScheduled
	deadLettered   []HookDeadLettered
	fenced         []HookFenced
	reconciled     []HookPartitionReconciled
	assigned       []HookPartitionsAssigned
	revoked        []HookPartitionsRevoked
	skipped        []HookOffsetsSkipped
	rolledBack     []HookRollbackReplayed
	unavailable    []HookDependencyUnavailable
	available      []HookDependencyAvailable
	lag            []HookPartitionLag
	paused         []HookPartitionPaused
	breaker        []HookBreakerChanged
	stuck          []HookHandlerStuck
	stalled        []HookPartitionStalled
	logChanged     []HookLogChanged
}

// newHookSet sorts hooks; a hook that implements none of the Hook* interfaces is an error
// (most likely a misspelt method).
// Hooks are numbered from 0 in user, after own.
func newHookSet(own []Hook, user []Hook) (hookSet, error) {
	var s hookSet
	for i, h := range append(own[:len(own):len(own)], user...) {
		n := 0
		if v, ok := h.(HookBatchCommitted); ok {
			s.batchCommitted = append(s.batchCommitted, v)
			n++
		}
		if v, ok := h.(HookRedeliveryDropped); ok {
			s.redelivery = append(s.redelivery, v)
			n++
		}
		if v, ok := h.(HookRetryScheduled); ok {
			s.retry = append(s.retry, v)
			n++
		}
		if v, ok := h.(HookDeadLettered); ok {
			s.deadLettered = append(s.deadLettered, v)
			n++
		}
		if v, ok := h.(HookFenced); ok {
			s.fenced = append(s.fenced, v)
			n++
		}
		if v, ok := h.(HookPartitionReconciled); ok {
			s.reconciled = append(s.reconciled, v)
			n++
		}
		if v, ok := h.(HookPartitionsAssigned); ok {
			s.assigned = append(s.assigned, v)
			n++
		}
		if v, ok := h.(HookPartitionsRevoked); ok {
			s.revoked = append(s.revoked, v)
			n++
		}
		if v, ok := h.(HookOffsetsSkipped); ok {
			s.skipped = append(s.skipped, v)
			n++
		}
		if v, ok := h.(HookRollbackReplayed); ok {
			s.rolledBack = append(s.rolledBack, v)
			n++
		}
		if v, ok := h.(HookDependencyUnavailable); ok {
			s.unavailable = append(s.unavailable, v)
			n++
		}
		if v, ok := h.(HookDependencyAvailable); ok {
			s.available = append(s.available, v)
			n++
		}
		if v, ok := h.(HookPartitionLag); ok {
			s.lag = append(s.lag, v)
			n++
		}
		if v, ok := h.(HookPartitionPaused); ok {
			s.paused = append(s.paused, v)
			n++
		}
		if v, ok := h.(HookBreakerChanged); ok {
			s.breaker = append(s.breaker, v)
			n++
		}
		if v, ok := h.(HookHandlerStuck); ok {
			s.stuck = append(s.stuck, v)
			n++
		}
		if v, ok := h.(HookPartitionStalled); ok {
			s.stalled = append(s.stalled, v)
			n++
		}
		if v, ok := h.(HookLogChanged); ok {
			s.logChanged = append(s.logChanged, v)
			n++
		}
		if n == 0 {
			return hookSet{}, fmt.Errorf("kafkatx: Config.Hooks[%d] (%T) implements none of the Hook* interfaces", i-len(own), h)
		}
	}
	return s, nil
}
