package order

import (
	"bufio"
	"os"
	"testing"
)

// TestDemoData checks the input of `make demo` (examples/orders/testdata/orders.jsonl) against
// the result its README promises: 8 orders with these totals, and the 9th line a poison pill.
func TestDemoData(t *testing.T) {
	f, err := os.Open("../testdata/orders.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := map[string]int64{
		"ORD-1001": 1998, "ORD-1002": 2450, "ORD-1003": 4995, "ORD-1004": 4425,
		"ORD-1005": 3900, "ORD-1006": 9990, "ORD-1007": 4900, "ORD-1008": 1475,
	}
	got := map[string]int64{}
	var poison []int
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		o, err := Parse(sc.Bytes())
		if err != nil {
			poison = append(poison, n)
			continue
		}
		got[o.OrderID] = o.TotalCents
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(poison) != 1 || poison[0] != 9 {
		t.Errorf("poison pills at lines %v; want line 9 only", poison)
	}
	if len(got) != len(want) {
		t.Errorf("%d orders parsed; want %d", len(got), len(want))
	}
	for id, cents := range want {
		if got[id] != cents {
			t.Errorf("%s: %d cents; want %d", id, got[id], cents)
		}
	}
}
