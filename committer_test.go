package kafkatx

import (
	"sort"
	"testing"

	"github.com/kafkatx/kafkatx/internal/offsetstore"
)

// TestCommitterCoalescesToTheNewestWatermark needs no broker: what the committer hands to
// Kafka is, per partition, the highest watermark enqueued since the last commit — never an
// older one after a newer, and one entry per partition however many batches committed.
func TestCommitterCoalescesToTheNewestWatermark(t *testing.T) {
	c := newCommitter(nil, nil)
	a, b, x := offsetstore.TP{Topic: "t", Partition: 0}, offsetstore.TP{Topic: "t", Partition: 1}, offsetstore.TP{Topic: "u", Partition: 0}
	for _, off := range []int64{10, 20, 30} {
		c.enqueue(a, off)
	}
	c.enqueue(b, 7)
	c.enqueue(b, 5) // a late, lower watermark (an older batch's hand-off) must not win
	c.enqueue(x, 1)

	got := map[offsetstore.TP]int64{}
	tps := c.take(map[offsetstore.TP]bool{a: true, b: true})
	for _, tp := range tps {
		k := offsetstore.TP{Topic: *tp.Topic, Partition: tp.Partition}
		if _, dup := got[k]; dup {
			t.Fatalf("partition %s handed to Kafka twice in one commit", k)
		}
		got[k] = int64(tp.Offset)
	}
	if len(got) != 2 || got[a] != 30 || got[b] != 7 {
		t.Fatalf("take(t[0], t[1]) = %v; want t[0]=30 t[1]=7", got)
	}
	if again := c.take(map[offsetstore.TP]bool{a: true, b: true}); len(again) != 0 {
		t.Fatalf("a second take returned %d partitions; taken watermarks must not be committed twice", len(again))
	}
	// The partition not asked for stays pending; drop forgets it (a lost partition).
	rest := c.take(nil)
	if len(rest) != 1 || *rest[0].Topic != "u" || rest[0].Offset != 1 {
		t.Fatalf("take(nil) = %v; want u[0]=1", rest)
	}
	c.enqueue(x, 2)
	c.drop(map[offsetstore.TP]bool{x: true})
	if left := c.take(nil); len(left) != 0 {
		t.Fatalf("dropped partition still pending: %v", left)
	}
	// A new watermark after a take is committed even if lower than one taken before: the
	// database leads, and a re-assignment may start a partition lower (an operator replay).
	c.enqueue(a, 3)
	var offs []int64
	for _, tp := range c.take(nil) {
		offs = append(offs, int64(tp.Offset))
	}
	sort.Slice(offs, func(i, j int) bool { return offs[i] < offs[j] })
	if len(offs) != 1 || offs[0] != 3 {
		t.Fatalf("after a take, enqueue(3) gave %v; want [3]", offs)
	}
}
