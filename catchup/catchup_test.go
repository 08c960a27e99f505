package catchup

import (
	"strings"
	"testing"

	"github.com/kafkatx/kafkatx/internal/offsets"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
)

// TestBehindLogEnd: the decision, row by row.
func TestBehindLogEnd(t *testing.T) {
	p := func(n int32) offsetstore.TP { return offsetstore.TP{Topic: "t", Partition: n} }
	wm := func(n int32, next int64) offsetstore.Watermark { return offsetstore.Watermark{TP: p(n), Next: next} }
	for _, tc := range []struct {
		name   string
		ranges map[offsetstore.TP]offsets.LogRange
		wms    map[offsetstore.TP]offsetstore.Watermark
		want   string
	}{
		{"all at the end", map[offsetstore.TP]offsets.LogRange{p(0): {Start: 0, End: 5}, p(1): {Start: 2, End: 7}}, map[offsetstore.TP]offsetstore.Watermark{p(0): wm(0, 5), p(1): wm(1, 7)}, ""},
		{"one behind", map[offsetstore.TP]offsets.LogRange{p(0): {Start: 0, End: 5}, p(1): {Start: 0, End: 7}}, map[offsetstore.TP]offsetstore.Watermark{p(0): wm(0, 5), p(1): wm(1, 6)}, "t[1] watermark 6, log end 7"},
		{"no watermark, records", map[offsetstore.TP]offsets.LogRange{p(0): {Start: 0, End: 5}}, nil, "t[0] no watermark, log 0..5"},
		{"no watermark, empty log", map[offsetstore.TP]offsets.LogRange{p(0): {Start: 4, End: 4}}, nil, ""},
		{"watermark past the end", map[offsetstore.TP]offsets.LogRange{p(0): {Start: 0, End: 5}}, map[offsetstore.TP]offsetstore.Watermark{p(0): wm(0, 6)}, ""},
	} {
		got := strings.Join(behindLogEnd(tc.ranges, tc.wms), "; ")
		if got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
