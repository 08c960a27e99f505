package offsetstate

import (
	"strings"
	"testing"
)

func TestCompareLog(t *testing.T) {
	a := LogID{Cluster: "c1", Topic: "t1"}
	for _, tc := range []struct {
		rec, cur             LogID
		topic, cluster, miss bool
	}{
		{a, a, false, false, false},
		{a, LogID{Cluster: "c1", Topic: "t2"}, true, false, false},
		{a, LogID{Cluster: "c2", Topic: "t1"}, false, true, false},
		{a, LogID{Cluster: "c2", Topic: "t2"}, true, true, false},
		{LogID{}, a, false, false, true},               // a row older than the ids: filled, not a change
		{a, LogID{Cluster: "c1"}, false, false, false}, // a broker without topic ids: unknown, not a change
		{LogID{Cluster: "c1"}, LogID{Cluster: "c2", Topic: "t9"}, false, true, true},
	} {
		c := CompareLog(tc.rec, tc.cur)
		if c.Topic != tc.topic || c.Cluster != tc.cluster || c.Missing() != tc.miss || c.Changed() != (tc.topic || tc.cluster) {
			t.Errorf("CompareLog(%v, %v) = %+v (missing %v); want topic %v cluster %v missing %v", tc.rec, tc.cur, c, c.Missing(), tc.topic, tc.cluster, tc.miss)
		}
	}
	w := CompareLog(a, LogID{Cluster: "c2", Topic: "t2"}).What()
	for _, s := range []string{"c1 -> c2", "t1 -> t2", "another Kafka cluster"} {
		if !strings.Contains(w, s) {
			t.Errorf("What() = %q, want it to name %q", w, s)
		}
	}
	if !LogChanged.Drift() {
		t.Error("log_changed is not drift")
	}
}
