package kafkatx

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/kafkatx/kafkatx/internal/engine"
)

// Readiness is a snapshot of what Consumer.Ready checks: is the consumer able to do its job
// now. Ready is true when the consumer runs, has joined its group and received an
// assignment (possibly empty) since it last lost one, reaches Kafka and PostgreSQL, every
// subscribed topic exists and is authorized, and no fatal or persistent authentication error
// occurred. Reasons says why not, one sentence per condition. The JSON form is what the
// example binaries serve on /readyz.
type Readiness struct {
	Ready   bool     `json:"ready"`
	Reasons []string `json:"reasons,omitempty"`
	// Joined: an assignment (possibly empty) was received and not lost since.
	Joined bool `json:"joined"`
	// AssignedPartitions counts the partitions this member owns.
	AssignedPartitions int `json:"assigned_partitions"`
	// MissingTopics are subscribed topics the cluster's metadata does not list: they do not
	// exist, or this client may not describe them.
	MissingTopics []string `json:"missing_topics,omitempty"`
	// KafkaError is the last error that says the brokers are unreachable (all brokers down, a
	// failed metadata request), with the time it started; empty once they answer.
	KafkaError      string    `json:"kafka_error,omitempty"`
	KafkaErrorSince time.Time `json:"kafka_error_since,omitzero"`
	// AuthError is a Kafka authentication or authorization failure (SASL, TLS, topic, group or
	// cluster ACLs) with the time it started; empty once the client authenticates (or is
	// assigned partitions, for group and cluster ACLs). The library keeps retrying; a binary
	// may exit when it persists (the examples: 30 s).
	AuthError      string    `json:"auth_error,omitempty"`
	AuthErrorSince time.Time `json:"auth_error_since,omitzero"`
	// DatabaseError is set when PostgreSQL did not answer a ping within 2 s (and no
	// transaction committed in the last 5 s).
	DatabaseError string `json:"database_error,omitempty"`
	// Fatal is the error that stopped (or is stopping) Run.
	Fatal string `json:"fatal,omitempty"`
	// Rejoining is set while a static member the broker fenced (it forgot the member after an
	// outage or a pause longer than session.timeout.ms) rejoins with a new Kafka client: the
	// fence's error, since RejoiningSince. Not ready meanwhile. A fence that repeats within
	// engine.FenceRepeatWindow (2 minutes) of a rejoin, with the brokers reachable, means
	// another live process holds the id: Fatal says so and Run ends (docs/consumer.md).
	Rejoining      string    `json:"rejoining,omitempty"`
	RejoiningSince time.Time `json:"rejoining_since,omitzero"`
	// Rejoins counts the new Kafka clients Run made after fences since it started.
	Rejoins int `json:"rejoins,omitempty"`
	// Waiting lists the partitions waiting for a dependency their handler reported
	// Unavailable (see UnavailableError), or waiting out the database's own condition
	// (WaitingPartition.Condition). For a dependency the consumer is still ready — it does its
	// job, and a restart would not bring the dependency back — but a probe or an operator sees
	// who waits, since when and why. For the database's own condition (a full disk, no
	// connection slots, a read-only server: docs/failures.md) it is not ready: nothing can be
	// written, and the reason names the SQLSTATE.
	Waiting []WaitingPartition `json:"waiting,omitempty"`
	// Breaker is set while the breaker is open (Config.Breaker): messages of several
	// partitions fail alike, and the failing partitions pause and probe. Not ready meanwhile,
	// except when what failed alike is a dependency's Unavailable answers (Dependency: with
	// Config.Park, several keys answered Unavailable with no success between, so no key
	// parks): ready then, as for any partition waiting on a dependency.
	Breaker *BreakerReadiness `json:"breaker,omitempty"`
	// Stuck lists the partitions whose handler call has run past its bound (Config.Transaction's
	// statement_timeout plus idle_in_transaction_session_timeout, 70 s by default): the
	// partition makes no progress. Not ready meanwhile.
	Stuck []StuckPartition `json:"stuck,omitempty"`
	// Stalled lists the partitions with lag (the log end past the watermark) whose watermark
	// has not moved for Config.StallAfter (2 minutes by default), whatever the cause. Not
	// ready meanwhile.
	Stalled []StalledPartition `json:"stalled,omitempty"`
	// BackpressureFailing lists the partitions whose Config.Backpressure check fails: their
	// batches wait and the check runs again, for at most Config.UnavailableMaxWait. Not ready
	// meanwhile.
	BackpressureFailing []BackpressureFailure `json:"backpressure_failing,omitempty"`
	// Checks holds the failing checks of what else the process runs (AddReadinessCheck): an
	// in-process outbox relay that cannot publish, say. Not ready while any fails.
	Checks []CheckFailure `json:"checks,omitempty"`
	// Notes holds what the process reports without being made unready (AddReadinessNote): an
	// Airflow DAG that is paused, say — a state of a dependency a restart would not change.
	// They never change Ready.
	Notes []ReadinessNote `json:"notes,omitempty"`
}

// ReadinessNote is a note added with AddReadinessNote that had something to say: its name
// and text.
type ReadinessNote struct {
	Name string `json:"name"`
	Note string `json:"note"`
}

// CheckFailure is a readiness check added with AddReadinessCheck that failed: its name and
// error.
type CheckFailure struct {
	Name  string `json:"name"`
	Error string `json:"error"`
}

// readinessChecks are the checks AddReadinessCheck added.
type readinessChecks struct {
	mu    sync.Mutex
	list  []namedCheck
	notes []namedNote // AddReadinessNote
}

type namedNote struct {
	name string
	note func(ctx context.Context) string
}

// AddReadinessNote makes Readiness also ask note, named name, for something an operator
// should see that does not make the consumer unready — a dependency's state a restart would
// not change, such as an Airflow DAG that is paused (examples/dagtrigger adds
// airflow.Client.ReadinessNote). A non-empty answer is listed in Readiness.Notes; Ready is
// unchanged. note must answer quickly (a probe calls it) and is called with Readiness's
// context. Safe from any goroutine, before or during Run.
func (c *Consumer) AddReadinessNote(name string, note func(ctx context.Context) string) {
	c.checks.mu.Lock()
	defer c.checks.mu.Unlock()
	c.checks.notes = append(c.checks.notes, namedNote{name: name, note: note})
}

type namedCheck struct {
	name  string
	check func(ctx context.Context) error
}

// AddReadinessCheck makes Ready and Readiness also ask check, named name, about something
// else the process runs that the consumer's readiness must cover — an in-process outbox relay
// (relay.Relay.Ready, walrelay.Relay.Ready): a non-nil error makes the consumer not ready,
// with the reason "name: error" (Readiness.Checks). check must answer quickly (a probe calls
// it); it is called with Readiness's context. Safe from any goroutine, before or during Run.
func (c *Consumer) AddReadinessCheck(name string, check func(ctx context.Context) error) {
	c.checks.mu.Lock()
	defer c.checks.mu.Unlock()
	c.checks.list = append(c.checks.list, namedCheck{name: name, check: check})
}

// BackpressureFailure is a partition whose Config.Backpressure check has failed since Since;
// Error is its last error (sanitized, at most 512 bytes).
type BackpressureFailure struct {
	Topic     string    `json:"topic"`
	Partition int32     `json:"partition"`
	Since     time.Time `json:"since"`
	Error     string    `json:"error"`
}

// StalledPartition is a partition whose watermark has stayed at Watermark since Since while
// its log reached LogEnd (when reported).
type StalledPartition struct {
	Topic     string    `json:"topic"`
	Partition int32     `json:"partition"`
	Watermark int64     `json:"watermark"`
	LogEnd    int64     `json:"log_end"`
	Since     time.Time `json:"since"`
}

// StuckPartition is a partition whose handler call, on the transaction starting at Offset,
// has run since Since.
type StuckPartition struct {
	Topic     string    `json:"topic"`
	Partition int32     `json:"partition"`
	Offset    int64     `json:"offset"`
	Since     time.Time `json:"since"`
}

// BreakerReadiness is an open breaker: since when, what the failures share (Signature: the
// SQLSTATE and its name for a PostgreSQL error, "SQLSTATE 42501 insufficient_privilege",
// otherwise the error text with its digits blanked), the SQLSTATE alone when there is one, an
// example failure, how many distinct messages failed alike when it opened, and the
// partitions it holds.
type BreakerReadiness struct {
	Since      time.Time `json:"since"`
	Signature  string    `json:"signature"`
	SQLState   string    `json:"sqlstate,omitempty"`
	Example    string    `json:"example"`
	Messages   int       `json:"messages"`
	Partitions []string  `json:"partitions"`
	// Dependency: the failures are a dependency's Unavailable answers (the consumer stays ready).
	Dependency bool `json:"dependency,omitempty"`
}

// WaitingPartition is a partition waiting for an unavailable dependency: the message at
// Offset has waited since Since; Cause is the handler's last Unavailable error (sanitized,
// at most 512 bytes).
type WaitingPartition struct {
	Topic     string    `json:"topic"`
	Partition int32     `json:"partition"`
	Offset    int64     `json:"offset"`
	Since     time.Time `json:"since"`
	Cause     string    `json:"cause"`
	// Condition names the database's own condition the partition waits out — its SQLSTATE
	// and name, "53100 disk_full" (docs/failures.md) — or is empty for a dependency's
	// Unavailable answer. While any partition waits out one, the consumer is not ready.
	Condition string `json:"condition,omitempty"`
}

// Ready reports nil when the consumer can do its job now (Readiness.Ready), else a
// *NotReadyError naming every reason. It pings PostgreSQL (2 s at most) unless a transaction
// committed in the last 5 s. Safe to call from any goroutine, for a readiness probe.
func (c *Consumer) Ready(ctx context.Context) error {
	r := c.Readiness(ctx)
	if r.Ready {
		return nil
	}
	return &NotReadyError{Readiness: r}
}

// Readiness returns the snapshot Ready decides on. Safe to call from any goroutine.
func (c *Consumer) Readiness(ctx context.Context) Readiness {
	h, snap := c.loop.Health(), c.loop.Snapshot()
	r := Readiness{Joined: h.Joined, MissingTopics: h.MissingTopics, AssignedPartitions: snap.Assigned,
		KafkaError: h.KafkaError, KafkaErrorSince: h.KafkaErrorSince, AuthError: h.AuthError, AuthErrorSince: h.AuthErrorSince}
	running := h.Running
	if h.Fatal != nil {
		r.Fatal = h.Fatal.Error()
	}
	for _, w := range snap.Waiting {
		r.Waiting = append(r.Waiting, WaitingPartition(w))
	}
	sort.Slice(r.Waiting, func(i, j int) bool {
		a, b := r.Waiting[i], r.Waiting[j]
		return a.Topic < b.Topic || a.Topic == b.Topic && a.Partition < b.Partition
	})
	if r.Fatal != "" {
		r.Reasons = append(r.Reasons, "fatal error: "+r.Fatal)
	}
	r.Rejoining, r.RejoiningSince, r.Rejoins = h.Rejoining, h.RejoiningSince, h.Rejoins
	if r.Rejoining != "" {
		r.Reasons = append(r.Reasons, fmt.Sprintf("rejoining the group with a new Kafka client since %s: the broker fenced this static member "+
			"(it forgot the member after an outage or a pause longer than session.timeout.ms; not another live process so far): %s",
			r.RejoiningSince.UTC().Format(time.RFC3339), r.Rejoining))
	}
	if reason := engine.ConditionReason(snap.Waiting); reason != "" {
		r.Reasons = append(r.Reasons, reason)
	}
	for _, s := range snap.Stuck {
		r.Stuck = append(r.Stuck, StuckPartition{Topic: s.TP.Topic, Partition: s.TP.Partition, Offset: s.Offset, Since: s.Since})
		r.Reasons = append(r.Reasons, fmt.Sprintf("the handler on %s offset %d has run since %s, past its bound: the partition makes no progress",
			s.TP, s.Offset, s.Since.UTC().Format(time.RFC3339)))
	}
	for _, s := range snap.Stalled {
		r.Stalled = append(r.Stalled, StalledPartition{Topic: s.TP.Topic, Partition: s.TP.Partition, Watermark: s.Watermark, LogEnd: s.LogEnd, Since: s.Since})
		r.Reasons = append(r.Reasons, fmt.Sprintf("%s has lag (watermark %d, log end %d) and has made no progress since %s (Config.StallAfter)",
			s.TP, s.Watermark, s.LogEnd, s.Since.UTC().Format(time.RFC3339)))
	}
	sort.Slice(r.Stalled, func(i, j int) bool {
		a, b := r.Stalled[i], r.Stalled[j]
		return a.Topic < b.Topic || a.Topic == b.Topic && a.Partition < b.Partition
	})
	for _, f := range snap.BackpressureFailing {
		r.BackpressureFailing = append(r.BackpressureFailing, BackpressureFailure{Topic: f.TP.Topic, Partition: f.TP.Partition, Since: f.Since, Error: f.Error})
	}
	if n := len(r.BackpressureFailing); n > 0 {
		sort.Slice(r.BackpressureFailing, func(i, j int) bool { return r.BackpressureFailing[i].Since.Before(r.BackpressureFailing[j].Since) })
		f := r.BackpressureFailing[0]
		r.Reasons = append(r.Reasons, fmt.Sprintf("Config.Backpressure cannot answer since %s on %d partition(s): %s; their batches wait (at most Config.UnavailableMaxWait)",
			f.Since.UTC().Format(time.RFC3339), n, f.Error))
	}
	if b := snap.Breaker; b != nil {
		r.Breaker = &BreakerReadiness{Since: b.Since, Signature: b.Signature, SQLState: b.SQLState, Example: b.Example, Messages: b.Messages, Dependency: b.Dependency}
		for _, tp := range b.Held {
			r.Breaker.Partitions = append(r.Breaker.Partitions, tp.String())
		}
		sort.Strings(r.Breaker.Partitions)
	}
	if b := snap.Breaker; b != nil && !b.Dependency {
		r.Reasons = append(r.Reasons, fmt.Sprintf("breaker open since %s: %d messages of the consumer failed alike (%s); the failing partitions pause and probe, spending no attempts (Config.Breaker)",
			b.Since.UTC().Format(time.RFC3339), b.Messages, b.Signature))
	}
	if !running {
		r.Reasons = append(r.Reasons, "the consumer is not running")
	}
	if running && !r.Joined {
		r.Reasons = append(r.Reasons, "not a member of the consumer group yet (no assignment received)")
	}
	if r.KafkaError != "" {
		r.Reasons = append(r.Reasons, fmt.Sprintf("Kafka unreachable since %s: %s", r.KafkaErrorSince.UTC().Format(time.RFC3339), r.KafkaError))
	}
	if r.AuthError != "" {
		r.Reasons = append(r.Reasons, fmt.Sprintf("Kafka authentication or authorization failing since %s: %s", r.AuthErrorSince.UTC().Format(time.RFC3339), r.AuthError))
	}
	if len(r.MissingTopics) > 0 {
		r.Reasons = append(r.Reasons, fmt.Sprintf("subscribed topics that do not exist or are not authorized: %s", strings.Join(r.MissingTopics, ", ")))
	}
	c.checks.mu.Lock()
	checks := append([]namedCheck(nil), c.checks.list...)
	notes := append([]namedNote(nil), c.checks.notes...)
	c.checks.mu.Unlock()
	for _, n := range notes {
		if s := n.note(ctx); s != "" {
			r.Notes = append(r.Notes, ReadinessNote{Name: n.name, Note: s})
		}
	}
	for _, ch := range checks {
		if err := ch.check(ctx); err != nil {
			r.Checks = append(r.Checks, CheckFailure{Name: ch.name, Error: err.Error()})
			r.Reasons = append(r.Reasons, ch.name+": "+err.Error())
		}
	}
	if time.Since(snap.LastCommit) > 5*time.Second {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := c.pool.Ping(pctx)
		cancel()
		if err != nil {
			r.DatabaseError = err.Error()
			r.Reasons = append(r.Reasons, "database unreachable: "+err.Error())
		}
	}
	r.Ready = len(r.Reasons) == 0
	return r
}
