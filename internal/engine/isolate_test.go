package engine

import (
	"errors"
	"testing"
	"time"
)

// TestSuspectPieces: a suspect range is cut into 16 pieces that tile it; a range of 16 offsets
// or fewer is all probes; each level narrows to at most a sixteenth.
func TestSuspectPieces(t *testing.T) {
	for _, tc := range []struct{ from, end int64 }{{0, 1}, {0, 12}, {100, 116}, {100, 117}, {0, 600}, {5000, 15000}} {
		s := newSuspect(tc.from, tc.end)
		n, probes := 0, 0
		for o := tc.from; o < tc.end; {
			e := s.pieceEnd(o)
			if e <= o || e > tc.end {
				t.Fatalf("%+v: piece of %d ends at %d", s, o, e)
			}
			for q := o; q < e; q++ {
				if s.pieceEnd(q) != e {
					t.Fatalf("%+v: %d in piece [%d, %d) but its end is %d", s, q, o, e, s.pieceEnd(q))
				}
				if s.single(q) != (e-o == 1) {
					t.Fatalf("%+v: single(%d) = %v in piece [%d, %d)", s, q, s.single(q), o, e)
				}
			}
			if e-o == 1 {
				probes++
			}
			n++
			o = e
		}
		if n > pieces || (tc.end-tc.from <= pieces && probes != int(tc.end-tc.from)) {
			t.Fatalf("%+v: %d pieces, %d probes", s, n, probes)
		}
		if s.holds(tc.from-1) || s.holds(tc.end) || s.single(tc.end) {
			t.Fatalf("%+v holds offsets outside it", s)
		}
	}
	if !newSuspect(100, 599).narrowed(500) || newSuspect(100, 600).narrowed(500) || newSuspect(0, 10000).narrowed(5000) {
		t.Fatal("narrowed: a range narrower than one batch")
	}
	if (suspect{}).holds(0) {
		t.Fatal("the zero suspect holds offset 0")
	}
}

// TestGateProbeRunsAlone: a probe waits for the units in flight, keeps new ones out while it
// runs, gives up after its bound (a unit stuck in its handler), and a stop ends every wait.
func TestGateProbeRunsAlone(t *testing.T) {
	g := newGate()
	stop := make(chan struct{})
	if err := g.enter(stop); err != nil {
		t.Fatal(err)
	}
	got := make(chan bool, 1)
	go func() {
		ok, err := g.alone(stop, 0)
		if err != nil {
			t.Error(err)
		}
		got <- ok
	}()
	select {
	case <-got:
		t.Fatal("the probe ran while a unit was in flight")
	case <-time.After(50 * time.Millisecond):
	}
	entered := make(chan struct{})
	go func() {
		if err := g.enter(stop); err == nil {
			close(entered)
		}
	}()
	g.leave()
	if !<-got {
		t.Fatal("alone = false with no bound")
	}
	select {
	case <-entered:
		t.Fatal("a unit entered while the probe ran")
	case <-time.After(50 * time.Millisecond):
	}
	g.release()
	<-entered
	// A unit stuck past the bound: the probe gives up being alone.
	start := time.Now()
	if ok, err := g.alone(stop, 30*time.Millisecond); ok || err != nil || time.Since(start) < 30*time.Millisecond {
		t.Fatalf("alone with a unit in flight past the bound = %v, %v after %v", ok, err, time.Since(start))
	}
	if err := g.enter(stop); err != nil { // the gate is open again
		t.Fatal(err)
	}
	g.leave()
	g.leave()
	// A stop ends a probe's wait and a unit's.
	if err := g.enter(stop); err != nil {
		t.Fatal(err)
	}
	close(stop)
	if _, err := g.alone(stop, 0); !errors.Is(err, errStopped) {
		t.Fatalf("alone after stop: %v", err)
	}
	g.leave()
	if ok, err := g.alone(make(chan struct{}), 0); !ok || err != nil {
		t.Fatalf("alone on an idle gate = %v, %v", ok, err)
	}
	if err := g.enter(stop); !errors.Is(err, errStopped) {
		t.Fatalf("enter during a probe after stop: %v", err)
	}
	g.release()
}
