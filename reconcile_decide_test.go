package kafkatx

import "testing"

// TestDecideStart covers every row of docs/offsets.md's reconciliation table with the pure
// decision; reconcile_test.go proves the same cases end to end against a broker.
func TestDecideStart(t *testing.T) {
	// A partition whose log holds offsets [10, 100).
	base := assignedOffsets{LogStart: 10, LogEnd: 100}
	with := func(f func(*assignedOffsets)) assignedOffsets { o := base; f(&o); return o }
	for _, tc := range []struct {
		name string
		in   assignedOffsets
		want startDecision
	}{
		{"no W, no K: first run at the log start (earliest)", with(func(o *assignedOffsets) {}),
			startDecision{Case: caseFirstRun, RetentionFrom: -1, Start: 10, Commit: true}},
		{"no W, no K, auto.offset.reset latest: first run at the log end", with(func(o *assignedOffsets) { o.StartAtEnd = true }),
			startDecision{Case: caseFirstRun, RetentionFrom: -1, Start: 100, Commit: true}},
		{"no W, K: first run adopts K without a commit", with(func(o *assignedOffsets) { o.K, o.HasK = 42, true }),
			startDecision{Case: caseFirstRun, RetentionFrom: -1, Start: 42}},
		{"W, no K: start at W and commit it again", with(func(o *assignedOffsets) { o.W, o.HasW = 50, true }),
			startDecision{Case: caseKafkaMissing, RetentionFrom: -1, W: 50, Start: 50, Commit: true}},
		{"K = W", with(func(o *assignedOffsets) { o.W, o.HasW, o.K, o.HasK = 50, true, 50, true }),
			startDecision{Case: caseAligned, RetentionFrom: -1, W: 50, Start: 50}},
		{"K = W = log end", with(func(o *assignedOffsets) { o.W, o.HasW, o.K, o.HasK = 100, true, 100, true }),
			startDecision{Case: caseAligned, RetentionFrom: -1, W: 100, Start: 100}},
		{"K < W: start at W, commit it again", with(func(o *assignedOffsets) { o.W, o.HasW, o.K, o.HasK = 50, true, 20, true }),
			startDecision{Case: caseKafkaBehind, RetentionFrom: -1, W: 50, Start: 50, Commit: true}},
		{"K > W: follow K", with(func(o *assignedOffsets) { o.W, o.HasW, o.K, o.HasK = 20, true, 50, true }),
			startDecision{Case: caseAheadFollow, RetentionFrom: -1, W: 20, Start: 50}},
		{"K > W under AheadHalt: halt with the drift", with(func(o *assignedOffsets) { o.W, o.HasW, o.K, o.HasK, o.OnAhead = 20, true, 50, true, AheadHalt }),
			startDecision{Case: caseAheadHalt, RetentionFrom: -1, W: 20, Drift: 30}},
		{"K = W under AheadHalt: no halt", with(func(o *assignedOffsets) { o.W, o.HasW, o.K, o.HasK, o.OnAhead = 20, true, 20, true, AheadHalt }),
			startDecision{Case: caseAligned, RetentionFrom: -1, W: 20, Start: 20}},
		{"K past the log end, no W: K ignored, first run at the log start", with(func(o *assignedOffsets) { o.K, o.HasK = 500, true }),
			startDecision{Case: caseFirstRun, IgnoreK: true, RetentionFrom: -1, Start: 10, Commit: true}},
		{"K past the log end, W: K ignored, start at W and commit it", with(func(o *assignedOffsets) { o.W, o.HasW, o.K, o.HasK = 50, true, 101, true }),
			startDecision{Case: caseKafkaMissing, IgnoreK: true, RetentionFrom: -1, W: 50, Start: 50, Commit: true}},
		{"W below the log start, K = old W: follow retention, behind only because of it", with(func(o *assignedOffsets) { o.W, o.HasW, o.K, o.HasK = 4, true, 4, true }),
			startDecision{Case: caseBehindAfterRetention, RetentionFrom: 4, W: 10, Start: 10, Commit: true}},
		{"W below the log start, K further behind: a lost commit as well", with(func(o *assignedOffsets) { o.W, o.HasW, o.K, o.HasK = 4, true, 2, true }),
			startDecision{Case: caseKafkaBehind, RetentionFrom: 4, W: 10, Start: 10, Commit: true}},
		{"W below the log start, K at the log start", with(func(o *assignedOffsets) { o.W, o.HasW, o.K, o.HasK = 4, true, 10, true }),
			startDecision{Case: caseAligned, RetentionFrom: 4, W: 10, Start: 10}},
		{"W below the log start, K ahead of the log start: follow K after retention", with(func(o *assignedOffsets) { o.W, o.HasW, o.K, o.HasK = 4, true, 30, true }),
			startDecision{Case: caseAheadFollow, RetentionFrom: 4, W: 10, Start: 30}},
		{"W below the log start, no K", with(func(o *assignedOffsets) { o.W, o.HasW = 4, true }),
			startDecision{Case: caseKafkaMissing, RetentionFrom: 4, W: 10, Start: 10, Commit: true}},
		{"W past the log end: halt", with(func(o *assignedOffsets) { o.W, o.HasW, o.K, o.HasK = 150, true, 150, true }),
			startDecision{Case: caseWatermarkPastLogEnd, IgnoreK: true, RetentionFrom: -1, W: 150}},
		{"W past the log end of an empty recreated topic: halt", assignedOffsets{W: 7, HasW: true},
			startDecision{Case: caseWatermarkPastLogEnd, RetentionFrom: -1, W: 7}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := decideStart(tc.in); got != tc.want {
				t.Errorf("decideStart(%+v)\n got %+v\nwant %+v", tc.in, got, tc.want)
			}
		})
	}
}
