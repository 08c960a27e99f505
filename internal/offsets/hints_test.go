package offsets

import (
	"strings"
	"testing"

	"github.com/kafkatx/kafkatx/internal/offsetstate"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
)

func i64(v int64) *int64 { return &v }

// Each drifted state's hint says what starting the consumer does and quotes the command
// for the other choice, with the partition's own offsets.
func TestHintsQuoteTheOtherCommand(t *testing.T) {
	t.Parallel()
	q := func(s string) string { return s }
	sts := []PartitionStatus{
		{Topic: "orders", Partition: 0, Watermark: i64(3), Committed: i64(3), State: offsetstate.Aligned},
		{Topic: "orders", Partition: 1, Watermark: i64(10), Committed: i64(4), State: offsetstate.KafkaBehind},
		{Topic: "orders", Partition: 2, Watermark: i64(5), Committed: i64(9), State: offsetstate.KafkaAhead},
		{Topic: "orders", Partition: 3, Watermark: i64(7), Committed: i64(12), State: offsetstate.KafkaAhead},
	}
	hs := Hints("s1", "g", sts, q)
	if len(hs) != 2 {
		t.Fatalf("%d hints, want one per drifted state: %q", len(hs), hs)
	}
	ahead, behind := hs[0], hs[1]
	for _, want := range []string{"orders[2] and 1 more", "SKIPS [5, 9) FOR GOOD", "unexplained_skip", "kafkatx offsets audit --group g",
		"`kafkatx offsets reset --schema s1 --group g --topic orders --to-database", "--partition 2 --to-offset 9 --mode skip"} {
		if !strings.Contains(ahead, want) {
			t.Errorf("kafka_ahead hint lacks %q: %s", want, ahead)
		}
	}
	for _, want := range []string{"IGNORES the rewind", "run [4, 10) again", "`kafkatx offsets reset --schema s1 --group g --topic orders --partition 1 --to-offset 4 --mode replay"} {
		if !strings.Contains(behind, want) {
			t.Errorf("kafka_behind hint lacks %q: %s", want, behind)
		}
	}
	if hs := Hints("s1", "g", sts[:1], q); len(hs) != 0 {
		t.Errorf("aligned partitions got hints: %q", hs)
	}
	u := UndoHint("s1", offsetstore.Event{Group: "g", Topic: "orders", Partition: 2, Kind: offsetstore.KindUnexplainedSkip, From: 5, To: 9}, q)
	if !strings.Contains(u, "--schema s1 --group g --topic orders --partition 2 --to-offset 5 --mode replay") || !strings.Contains(u, "kept no copy") {
		t.Errorf("undo hint: %s", u)
	}
	if u := UndoHint("s1", offsetstore.Event{Kind: offsetstore.KindReplay, From: 1, To: 2}, q); u != "" {
		t.Errorf("a replay got an undo hint: %s", u)
	}
}
