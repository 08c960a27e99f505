package offsets

import (
	"reflect"
	"testing"

	"github.com/kafkatx/kafkatx/internal/offsetstore"
)

func ev(id int64, kind string, from, to int64) offsetstore.Event {
	return offsetstore.Event{ID: id, Kind: kind, From: from, To: to, Status: StatusApplied}
}

func TestAccountTimeline(t *testing.T) {
	tp := offsetstore.TP{Topic: "t", Partition: 0}
	for _, tc := range []struct {
		name     string
		first    int64
		next     int64
		events   []offsetstore.Event
		segs     []Segment
		gaps     int
		counts   [3]int64 // processed, operator-skipped, unexplained-skipped
		accounts bool
	}{
		{name: "processed only", first: 0, next: 10, events: []offsetstore.Event{ev(1, offsetstore.KindFirstRun, 0, 0)},
			segs: []Segment{{0, 10, SegProcessed, 0}}, counts: [3]int64{10, 0, 0}, accounts: true},
		{name: "operator and unexplained skips", first: 5, next: 30, events: []offsetstore.Event{
			ev(1, offsetstore.KindFirstRun, 5, 5), ev(2, offsetstore.KindOperatorSkip, 8, 9), ev(3, offsetstore.KindKafkaBehind, 2, 12),
			ev(4, offsetstore.KindUnexplainedSkip, 20, 25)},
			segs:   []Segment{{5, 8, SegProcessed, 0}, {8, 9, SegOperatorSkip, 2}, {9, 20, SegProcessed, 0}, {20, 25, SegUnexplainedSkip, 4}, {25, 30, SegProcessed, 0}},
			counts: [3]int64{19, 1, 5}, accounts: true},
		{name: "pending and abandoned skips are not moves", first: 0, next: 10, events: []offsetstore.Event{
			{ID: 1, Kind: offsetstore.KindOperatorSkip, From: 3, To: 4, Status: StatusPending},
			{ID: 2, Kind: offsetstore.KindOperatorSkip, From: 3, To: 6, Status: StatusAbandoned}},
			segs: []Segment{{0, 10, SegProcessed, 0}}, counts: [3]int64{10, 0, 0}, accounts: true},
		{name: "a replay re-processes a skipped range", first: 0, next: 20, events: []offsetstore.Event{
			ev(1, offsetstore.KindOperatorSkip, 5, 8), ev(2, offsetstore.KindReplay, 2, 12)},
			segs: []Segment{{0, 20, SegProcessed, 0}}, counts: [3]int64{20, 0, 0}, accounts: true},
		{name: "a replay that has not caught up", first: 0, next: 4, events: []offsetstore.Event{
			ev(1, offsetstore.KindOperatorSkip, 5, 8), ev(2, offsetstore.KindReplay, 2, 12)},
			segs: []Segment{{0, 4, SegProcessed, 0}}, counts: [3]int64{4, 0, 0}, accounts: true},
		{name: "hand-made forward move", first: 0, next: 15, events: []offsetstore.Event{ev(1, offsetstore.KindUnexplainedMove, 8, 11)},
			segs: []Segment{{0, 8, SegProcessed, 0}, {8, 11, SegGap, 1}, {11, 15, SegProcessed, 0}}, gaps: 1, counts: [3]int64{12, 0, 0}},
		{name: "hand-made rewind", first: 0, next: 15, events: []offsetstore.Event{ev(1, offsetstore.KindUnexplainedMove, 11, 8)},
			segs: []Segment{{0, 15, SegProcessed, 0}}, gaps: 1, counts: [3]int64{15, 0, 0}},
		{name: "audit row behind the watermark", first: 0, next: 15, events: []offsetstore.Event{
			ev(1, offsetstore.KindOperatorSkip, 8, 10), ev(2, offsetstore.KindUnexplainedSkip, 6, 7)},
			// The watermark went back from 10 to 6 with no record; the loop then processed 7..14 (again).
			gaps: 1, counts: [3]int64{14, 0, 1},
			segs: []Segment{{0, 6, SegProcessed, 0}, {6, 7, SegUnexplainedSkip, 2}, {7, 15, SegProcessed, 0}}},
		{name: "deleted row", first: 4, next: 9, events: []offsetstore.Event{
			ev(1, offsetstore.KindOperatorSkip, 0, 2), ev(2, offsetstore.KindWatermarkDeleted, 0, 7), ev(3, offsetstore.KindFirstRun, 4, 4)},
			segs: []Segment{{4, 9, SegProcessed, 0}}, gaps: 1, counts: [3]int64{5, 0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := account("g", offsetstore.Watermark{TP: tp, First: tc.first, Next: tc.next}, tc.events)
			if !reflect.DeepEqual(a.Segments, tc.segs) {
				t.Errorf("segments %v, want %v", a.Segments, tc.segs)
			}
			if len(a.Gaps) != tc.gaps || a.Accounted() != tc.accounts {
				t.Errorf("gaps %+v (accounted %v), want %d gaps", a.Gaps, a.Accounted(), tc.gaps)
			}
			if got := [3]int64{a.Processed, a.OperatorSkipped, a.UnexplainedSkipped}; got != tc.counts {
				t.Errorf("processed, operator-skipped, unexplained-skipped = %v, want %v", got, tc.counts)
			}
			var sum int64
			for _, s := range a.Segments {
				sum += s.Len()
			}
			if sum != a.Offsets || a.Offsets != tc.next-tc.first {
				t.Errorf("segments cover %d offsets, report says %d, want %d", sum, a.Offsets, tc.next-tc.first)
			}
		})
	}
}

func TestSegmentsPaint(t *testing.T) {
	var ss segments
	ss.paint(Segment{From: 0, To: 10, Kind: SegProcessed})
	ss.paint(Segment{From: 3, To: 5, Kind: SegOperatorSkip, EventID: 7})
	ss.paint(Segment{From: 4, To: 6, Kind: SegProcessed})
	want := segments{{0, 3, SegProcessed, 0}, {3, 4, SegOperatorSkip, 7}, {4, 10, SegProcessed, 0}}
	if !reflect.DeepEqual(ss, want) {
		t.Fatalf("paint: %v, want %v", ss, want)
	}
	if got := ss.clip(2, 12); !reflect.DeepEqual(got, []Segment{{2, 3, SegProcessed, 0}, {3, 4, SegOperatorSkip, 7}, {4, 10, SegProcessed, 0}, {10, 12, SegGap, 0}}) {
		t.Fatalf("clip: %v", got)
	}
}
