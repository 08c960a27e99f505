// Package offsetstate classifies one partition's offsets — the database watermark W, Kafka's
// committed offset K and the log's range — into the one vocabulary that the consumer's start
// decision (internal/engine, on every assignment), `kafkatx offsets status`, the logs and the
// metrics share. docs/offsets.md's reconciliation table has a row in state_test.go for each
// of its rows.
package offsetstate

// State names a partition's offsets. offsets status prints it; the consumer logs it with its
// decision. The names are part of the CLI's JSON output.
type State string

const (
	// Aligned: K = W.
	Aligned State = "aligned"
	// KafkaAhead: K > W — an offset moved with Kafka's own tools, a kafkatx operator skip, or
	// a database restored from an older backup. The consumer follows K and audits [W, K), or
	// halts under the halt policy.
	KafkaAhead State = "kafka_ahead"
	// KafkaBehind: K < W — a lost commit or a rewind with Kafka's tools; the consumer starts
	// at W and commits it again.
	KafkaBehind State = "kafka_behind"
	// KafkaMissing: W and no K (the group's offsets expired or were deleted); the consumer
	// starts at W and commits it again.
	KafkaMissing State = "kafka_missing"
	// NoWatermark: K and no W: kafkatx never ran the partition for the group; its first run
	// starts at K. Not drift.
	NoWatermark State = "no_watermark"
	// Unused: neither W nor K; a first run starts at auto.offset.reset. Not drift.
	Unused State = "unused"
	// WatermarkPastLogEnd: W > the log end — records processed are no longer in the log: it
	// was truncated (an unclean leader election), or, for a watermark recorded before topic
	// ids (LogChanged catches the rest), the topic was deleted and recreated. The consumer
	// processes nothing (kafkatx.LogRangeError).
	WatermarkPastLogEnd State = "watermark_past_log_end"
	// WatermarkBelowLogStart: W < the log start — retention removed records before they were
	// processed; the consumer audits [W, log start) as an unexplained skip, moves W there and
	// then compares it with K.
	WatermarkBelowLogStart State = "watermark_below_log_start"
	// KafkaPastLogEnd: K > the log end; the consumer ignores K and decides as if there were none.
	KafkaPastLogEnd State = "kafka_past_log_end"
)

// Drift reports whether s is a disagreement the consumer repairs, audits or halts on.
func (s State) Drift() bool {
	switch s {
	case Aligned, NoWatermark, Unused:
		return false
	}
	return true
}

// Offsets is what is known of one partition.
type Offsets struct {
	W    int64 // the database watermark: the next offset to process
	HasW bool  // false: kafkatx never ran the partition for this group
	K    int64 // Kafka's committed offset for the group
	HasK bool  // false: no committed offset (never committed, expired or deleted)

	LogStart, LogEnd int64 // the partition's first offset and the offset after its last record
}

// Policy is the consumer's part of the decision: where a first run starts without K
// (auto.offset.reset latest: the log end; else the log start) and whether K > W halts
// (Config.OnKafkaAhead = AheadHalt).
type Policy struct {
	StartAtEnd  bool
	HaltOnAhead bool
}

// Decision is Classify's answer.
type Decision struct {
	// State is the partition's state: the first of, in this order, WatermarkPastLogEnd,
	// WatermarkBelowLogStart, KafkaPastLogEnd, else Compared.
	State State
	// Compared compares W (after following the log start) with K (unless ignored):
	// Aligned, KafkaAhead, KafkaBehind, KafkaMissing, NoWatermark or Unused; "" when State
	// is WatermarkPastLogEnd (nothing is compared).
	Compared State
	// IgnoreK: K was past the log end; the consumer audits it (kafka_out_of_range) and
	// decides as if there were no K.
	IgnoreK bool
	// RetentionFrom is W before the log start passed it, or -1: the consumer follows
	// [RetentionFrom, LogStart) as an unexplained skip before it compares.
	RetentionFrom int64
	// W is the watermark Compared used (the log start after a retention follow).
	W int64
	// BehindAfterRetention: Compared is KafkaBehind only because W followed the log start
	// (K >= RetentionFrom): nothing to audit, commit W.
	BehindAfterRetention bool

	// Halt: the consumer processes nothing (WatermarkPastLogEnd, or KafkaAhead under the
	// halt policy).
	Halt bool
	// Start is the offset to fetch from; for a first run also the watermark to record.
	Start int64
	// Commit: commit Start to Kafka (K is missing, behind, or ignored; a first run without K).
	Commit bool
	// Drift is the drift gauge's value once the decision is applied: K − W when halting on
	// KafkaAhead, else 0.
	Drift int64
}

// Classify applies docs/offsets.md's rules to o. It reads no state and has no effects.
func Classify(o Offsets, p Policy) Decision {
	d := Decision{RetentionFrom: -1, W: o.W}
	k, hasK := o.K, o.HasK
	if hasK && k > o.LogEnd {
		// A committed offset past the log end names offsets that do not exist: following it
		// would skip records not yet written. The database decides instead.
		d.IgnoreK, hasK = true, false
	}
	switch {
	case o.HasW && o.W > o.LogEnd:
		// The log is shorter than what was processed. Which records are new cannot be told,
		// so nothing is processed until an operator decides.
		d.State, d.Halt = WatermarkPastLogEnd, true
		return d
	case o.HasW && o.W < o.LogStart:
		// Retention (or delete-records) removed records before they were processed.
		d.State, d.RetentionFrom, d.W = WatermarkBelowLogStart, o.W, o.LogStart
	case d.IgnoreK:
		d.State = KafkaPastLogEnd
	}
	switch {
	case !o.HasW && hasK:
		d.Compared, d.Start = NoWatermark, k
	case !o.HasW:
		d.Compared, d.Start, d.Commit = Unused, o.LogStart, true
		if p.StartAtEnd {
			d.Start = o.LogEnd
		}
	case !hasK:
		d.Compared, d.Start, d.Commit = KafkaMissing, d.W, true
	case k == d.W:
		d.Compared, d.Start = Aligned, d.W
	case k < d.W:
		d.Compared, d.Start, d.Commit = KafkaBehind, d.W, true
		d.BehindAfterRetention = d.RetentionFrom >= 0 && k >= d.RetentionFrom
	case p.HaltOnAhead:
		d.Compared, d.Halt, d.Drift = KafkaAhead, true, k-d.W
	default:
		d.Compared, d.Start = KafkaAhead, k
	}
	if d.State == "" {
		d.State = d.Compared
	}
	return d
}
