package offsetstate

import "testing"

// TestClassify has a row for each row of docs/offsets.md's reconciliation table (marked
// "table:"), then the combinations between them. Both the consumer's start decision and
// `kafkatx offsets status` take their answer from Classify, so each row also fixes the state
// the CLI prints for it. internal/engine's reconcile tests and cmd/kafkatx's offsets tests prove
// the same cases end to end against a broker.
func TestClassify(t *testing.T) {
	// A partition whose log holds offsets [10, 100).
	base := Offsets{LogStart: 10, LogEnd: 100}
	with := func(f func(*Offsets)) Offsets { o := base; f(&o); return o }
	halt := Policy{HaltOnAhead: true}
	for _, tc := range []struct {
		name string
		in   Offsets
		p    Policy
		want Decision
	}{
		{"table: no W, no K: first run at the log start (earliest)", with(func(o *Offsets) {}), Policy{},
			Decision{State: Unused, Compared: Unused, RetentionFrom: -1, Start: 10, Commit: true}},
		{"table: no W, K: first run adopts K without a commit", with(func(o *Offsets) { o.K, o.HasK = 42, true }), Policy{},
			Decision{State: NoWatermark, Compared: NoWatermark, RetentionFrom: -1, Start: 42}},
		{"table: W, no K: start at W and commit it again", with(func(o *Offsets) { o.W, o.HasW = 50, true }), Policy{},
			Decision{State: KafkaMissing, Compared: KafkaMissing, RetentionFrom: -1, W: 50, Start: 50, Commit: true}},
		{"table: K = W", with(func(o *Offsets) { o.W, o.HasW, o.K, o.HasK = 50, true, 50, true }), Policy{},
			Decision{State: Aligned, Compared: Aligned, RetentionFrom: -1, W: 50, Start: 50}},
		{"table: K < W: start at W, commit it again", with(func(o *Offsets) { o.W, o.HasW, o.K, o.HasK = 50, true, 20, true }), Policy{},
			Decision{State: KafkaBehind, Compared: KafkaBehind, RetentionFrom: -1, W: 50, Start: 50, Commit: true}},
		{"table: K > W (an operator skip on record, or not: the consumer tells them apart): follow K", with(func(o *Offsets) { o.W, o.HasW, o.K, o.HasK = 20, true, 50, true }), Policy{},
			Decision{State: KafkaAhead, Compared: KafkaAhead, RetentionFrom: -1, W: 20, Start: 50}},
		{"table: K > W under AheadHalt: halt with the drift", with(func(o *Offsets) { o.W, o.HasW, o.K, o.HasK = 20, true, 50, true }), halt,
			Decision{State: KafkaAhead, Compared: KafkaAhead, Halt: true, RetentionFrom: -1, W: 20, Drift: 30}},
		{"table: K > W with the consumer's own mark of this database: a rollback of the database, re-process from W and commit it", with(func(o *Offsets) { o.W, o.HasW, o.K, o.HasK, o.KMarkedHere = 20, true, 50, true, true }), Policy{},
			Decision{State: DatabaseRolledBack, Compared: DatabaseRolledBack, RetentionFrom: -1, W: 20, Start: 20, Commit: true}},
		{"K > W with the consumer's own mark, under AheadHalt: re-process, no halt (nothing is lost)", with(func(o *Offsets) { o.W, o.HasW, o.K, o.HasK, o.KMarkedHere = 20, true, 50, true, true }), halt,
			Decision{State: DatabaseRolledBack, Compared: DatabaseRolledBack, RetentionFrom: -1, W: 20, Start: 20, Commit: true}},
		{"K < W with the consumer's own mark: kafka_behind as without", with(func(o *Offsets) { o.W, o.HasW, o.K, o.HasK, o.KMarkedHere = 50, true, 20, true, true }), Policy{},
			Decision{State: KafkaBehind, Compared: KafkaBehind, RetentionFrom: -1, W: 50, Start: 50, Commit: true}},
		{"W below the log start, marked K ahead of it: follow retention, then re-process from the log start", with(func(o *Offsets) { o.W, o.HasW, o.K, o.HasK, o.KMarkedHere = 4, true, 30, true, true }), Policy{},
			Decision{State: WatermarkBelowLogStart, Compared: DatabaseRolledBack, RetentionFrom: 4, W: 10, Start: 10, Commit: true}},
		{"table: K past the log end, no W: K ignored, first run at the log start", with(func(o *Offsets) { o.K, o.HasK = 500, true }), Policy{},
			Decision{State: KafkaPastLogEnd, Compared: Unused, IgnoreK: true, RetentionFrom: -1, Start: 10, Commit: true}},
		{"table: W below the log start, K = old W: follow retention, behind only because of it", with(func(o *Offsets) { o.W, o.HasW, o.K, o.HasK = 4, true, 4, true }), Policy{},
			Decision{State: WatermarkBelowLogStart, Compared: KafkaBehind, BehindAfterRetention: true, RetentionFrom: 4, W: 10, Start: 10, Commit: true}},
		{"table: W past the log end: halt", with(func(o *Offsets) { o.W, o.HasW, o.K, o.HasK = 150, true, 150, true }), Policy{},
			Decision{State: WatermarkPastLogEnd, Halt: true, IgnoreK: true, RetentionFrom: -1, W: 150}},

		{"no W, no K, auto.offset.reset latest: first run at the log end", with(func(o *Offsets) {}), Policy{StartAtEnd: true},
			Decision{State: Unused, Compared: Unused, RetentionFrom: -1, Start: 100, Commit: true}},
		{"K = W = log end", with(func(o *Offsets) { o.W, o.HasW, o.K, o.HasK = 100, true, 100, true }), Policy{},
			Decision{State: Aligned, Compared: Aligned, RetentionFrom: -1, W: 100, Start: 100}},
		{"K = W under AheadHalt: no halt", with(func(o *Offsets) { o.W, o.HasW, o.K, o.HasK = 20, true, 20, true }), halt,
			Decision{State: Aligned, Compared: Aligned, RetentionFrom: -1, W: 20, Start: 20}},
		{"K past the log end, W: K ignored, start at W and commit it", with(func(o *Offsets) { o.W, o.HasW, o.K, o.HasK = 50, true, 101, true }), Policy{},
			Decision{State: KafkaPastLogEnd, Compared: KafkaMissing, IgnoreK: true, RetentionFrom: -1, W: 50, Start: 50, Commit: true}},
		{"W below the log start, K further behind: a lost commit as well", with(func(o *Offsets) { o.W, o.HasW, o.K, o.HasK = 4, true, 2, true }), Policy{},
			Decision{State: WatermarkBelowLogStart, Compared: KafkaBehind, RetentionFrom: 4, W: 10, Start: 10, Commit: true}},
		{"W below the log start, K at the log start", with(func(o *Offsets) { o.W, o.HasW, o.K, o.HasK = 4, true, 10, true }), Policy{},
			Decision{State: WatermarkBelowLogStart, Compared: Aligned, RetentionFrom: 4, W: 10, Start: 10}},
		{"W below the log start, K ahead of the log start: follow K after retention", with(func(o *Offsets) { o.W, o.HasW, o.K, o.HasK = 4, true, 30, true }), Policy{},
			Decision{State: WatermarkBelowLogStart, Compared: KafkaAhead, RetentionFrom: 4, W: 10, Start: 30}},
		{"W below the log start, no K", with(func(o *Offsets) { o.W, o.HasW = 4, true }), Policy{},
			Decision{State: WatermarkBelowLogStart, Compared: KafkaMissing, RetentionFrom: 4, W: 10, Start: 10, Commit: true}},
		{"W below the log start and K past the log end: the watermark is named first", with(func(o *Offsets) { o.W, o.HasW, o.K, o.HasK = 4, true, 500, true }), Policy{},
			Decision{State: WatermarkBelowLogStart, Compared: KafkaMissing, IgnoreK: true, RetentionFrom: 4, W: 10, Start: 10, Commit: true}},
		{"W past the log end of an empty recreated topic: halt", Offsets{W: 7, HasW: true}, Policy{},
			Decision{State: WatermarkPastLogEnd, Halt: true, RetentionFrom: -1, W: 7}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Classify(tc.in, tc.p); got != tc.want {
				t.Errorf("Classify(%+v, %+v)\n got %+v\nwant %+v", tc.in, tc.p, got, tc.want)
			}
		})
	}
}

// TestDrift: the states that need no repair are exactly aligned, no_watermark and unused.
func TestDrift(t *testing.T) {
	for s, want := range map[State]bool{Aligned: false, NoWatermark: false, Unused: false, KafkaAhead: true, KafkaBehind: true,
		KafkaMissing: true, WatermarkPastLogEnd: true, WatermarkBelowLogStart: true, KafkaPastLogEnd: true, DatabaseRolledBack: true} {
		if s.Drift() != want {
			t.Errorf("%s.Drift() = %v, want %v", s, !want, want)
		}
	}
}

// TestCommitMark: the consumer's commit metadata reads back as written; anything else — Kafka's
// tools' empty metadata, another tool's text, another version, a damaged mark — is no mark.
func TestCommitMark(t *testing.T) {
	m := CommitMark{Database: Database{System: "7715095071469280140", OID: 16385, Timeline: 3}, Epoch: 2}
	s := m.String()
	if s != "kafkatx/1 s=7715095071469280140 d=16385 t=3 e=2" {
		t.Fatalf("String() = %q", s)
	}
	got, ok := ParseCommitMark(s)
	if !ok || got != m {
		t.Fatalf("ParseCommitMark(%q) = %+v, %v", s, got, ok)
	}
	for _, bad := range []string{"", "kafkatx/2 s=1 d=2 t=3 e=4", "kafkatx/1 s=1 d=2 t=3", "kafkatx/1 d=2 s=1 t=3 e=4",
		"kafkatx/1 s=x d=2 t=3 e=4", "kafkatx/1 s=1 d=99999999999 t=3 e=4", "kafkatx/1 s=1 d=2 t=3 e=4 x=5", "some tool's note"} {
		if _, ok := ParseCommitMark(bad); ok {
			t.Errorf("ParseCommitMark(%q) reads a mark", bad)
		}
	}
	if !m.Same(Database{System: m.System, OID: m.OID, Timeline: 9}) {
		t.Error("a new timeline of the same database is not Same")
	}
	if m.Same(Database{System: m.System, OID: 1}) || m.Same(Database{System: "1", OID: m.OID}) || (Database{}).Same(Database{}) {
		t.Error("another database, another cluster or nothing is Same")
	}
}
