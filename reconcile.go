package kafkatx

// Reconciliation on assignment, as a pure decision: given what the database and Kafka say
// about one assigned partition, where does the worker start and what must be recorded? The
// rules are those of docs/offsets.md ("Reconciliation on assignment"); rebalance.go reads the
// offsets, applies the decision (audit rows, logs, metrics, commits) and starts the worker.

// assignedOffsets is what reconciliation reads for one assigned partition.
type assignedOffsets struct {
	W    int64 // the database watermark: the next offset to process
	HasW bool  // false: kafkatx never ran the partition for this group
	K    int64 // Kafka's committed offset for the group
	HasK bool  // false: no committed offset (never committed, expired or deleted)

	LogStart, LogEnd int64 // the partition's first offset and the offset after its last record

	StartAtEnd bool        // the user's auto.offset.reset starts new partitions at the log end
	OnAhead    AheadPolicy // Config.OnKafkaAhead
}

// startCase names the case of docs/offsets.md's reconciliation table that applies.
type startCase string

const (
	caseFirstRun             startCase = "first_run"              // no W: start at K, else at auto.offset.reset, and record W
	caseKafkaMissing         startCase = "kafka_missing"          // W, no K: start at W, commit it again
	caseAligned              startCase = "aligned"                // K = W
	caseBehindAfterRetention startCase = "behind_after_retention" // K < W only because W just followed the log start
	caseKafkaBehind          startCase = "kafka_behind"           // K < W: lost commit or rewind; start at W, commit it again
	caseAheadFollow          startCase = "kafka_ahead_follow"     // K > W: follow K, audit [W, K) as a skip
	caseAheadHalt            startCase = "kafka_ahead_halt"       // K > W under AheadHalt: process nothing
	caseWatermarkPastLogEnd  startCase = "watermark_past_log_end" // W > log end: topic recreated or truncated; halt
)

// startDecision is what to do for one assigned partition, in the order rebalance.go applies it.
type startDecision struct {
	Case startCase
	// IgnoreK: K was past the log end; it is audited (kafka_out_of_range) and the decision
	// is taken as if there were no K.
	IgnoreK bool
	// RetentionFrom is the watermark before retention moved the log start past it, or -1:
	// when set, [RetentionFrom, LogStart) is followed as an unexplained skip before the
	// comparison with K, and W below is the log start.
	RetentionFrom int64
	// W is the watermark the comparison used (after a retention follow).
	W int64
	// Start is the offset to fetch from; for caseFirstRun also the watermark to record.
	Start int64
	// Commit: commit Start to Kafka (it is missing, behind, or a first run without K).
	Commit bool
	// Drift is the drift gauge's value once the decision is applied (K − W when halting,
	// else 0: the partition starts aligned).
	Drift int64
}

// decideStart applies the rules of docs/offsets.md to one partition's offsets. It reads no
// state and has no effects; every case has a row in reconcile_decide_test.go.
func decideStart(o assignedOffsets) startDecision {
	d := startDecision{RetentionFrom: -1, W: o.W}
	k, hasK := o.K, o.HasK
	if hasK && k > o.LogEnd {
		// A committed offset past the log end names offsets that do not exist: following it
		// would skip records not yet written. The database decides instead.
		d.IgnoreK, hasK = true, false
	}
	if o.HasW && o.W > o.LogEnd {
		// The log is shorter than what was processed. Which records are new cannot be told,
		// so nothing is processed until an operator decides.
		d.Case = caseWatermarkPastLogEnd
		return d
	}
	if o.HasW && o.W < o.LogStart {
		// Retention (or delete-records) removed records before they were processed.
		d.RetentionFrom, d.W = o.W, o.LogStart
	}
	switch {
	case !o.HasW:
		d.Case = caseFirstRun
		switch {
		case hasK:
			d.Start = k
		case o.StartAtEnd:
			d.Start, d.Commit = o.LogEnd, true
		default:
			d.Start, d.Commit = o.LogStart, true
		}
	case !hasK:
		d.Case, d.Start, d.Commit = caseKafkaMissing, d.W, true
	case k == d.W:
		d.Case, d.Start = caseAligned, d.W
	case k < d.W && d.RetentionFrom >= 0 && k >= d.RetentionFrom:
		d.Case, d.Start, d.Commit = caseBehindAfterRetention, d.W, true
	case k < d.W:
		d.Case, d.Start, d.Commit = caseKafkaBehind, d.W, true
	case o.OnAhead == AheadHalt:
		d.Case, d.Drift = caseAheadHalt, k-d.W
	default:
		d.Case, d.Start = caseAheadFollow, k
	}
	return d
}
