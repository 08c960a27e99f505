package engine

import (
	"sync"
	"time"
)

// Crash isolation (docs/design.md, "Crash isolation by pieces"). A partition's in-flight
// marker covers what its worker holds; a process that ends without committing leaves the
// marker above the watermark, and the next owner knows only that some message in
// [watermark, marker) may have killed it — or that nothing did (a SIGKILL, an OOM kill of
// another partition's handler). It finds out without one transaction per message: the
// suspect range is cut into `pieces` pieces, each run as its own marked batch (the marker
// set to exactly the piece's end, in the commit of the piece before), so a crash in a piece
// leaves that piece as the next start's suspect range — a sixteenth of the one before — and a
// range that committed whole cost 16 transactions. A range of one offset is a probe: its
// message runs alone in the process (gate.alone: no other unit of any partition in flight),
// with its attempt recorded durably before the handler runs (BeginAttempt); so do the pieces of
// a range narrower than a batch (narrowed), so that pills in several partitions do not
// mislead each other's searches. Only a probe's
// crash is counted as the message's: a message that shared a range with a crasher is never
// charged for it, and neither is one whose range a kill of another partition's work ended.
// A pill costs 1 + log16(range) + MaxAttempts starts; the range is at most two batches.

// pieces is how many pieces a suspect range is cut into. Sixteen rather than two (halving):
// a crash pill costs one process start per level, and restarts are what a crash loop pays
// for (a static member's rejoin, the producer's and pools' start), while the extra
// transactions of a range that commits are cheap (16 batches of a sixteenth).
const pieces = 16

// suspect is the range [from, end) of a partition's offsets that was in flight when the
// previous owner's process ended without committing it, cut into pieces of size offsets.
// The zero value holds nothing.
type suspect struct{ from, end, size int64 }

func newSuspect(from, end int64) suspect {
	if end <= from {
		return suspect{}
	}
	return suspect{from: from, end: end, size: max(1, (end-from+pieces-1)/pieces)}
}

// narrowed reports whether the range is narrower than one batch of batchSize: what a kill
// mid-drain leaves covers at least the batch that ran (and up to one more), so a narrower range
// is most likely the piece of an earlier start's range (or a trickle's, which costs little).
// Its pieces run alone in the process, so that a crash during one is that piece's and not
// another partition's, and the search narrows the right range; a wider range runs beside the
// other partitions, at the speed of the drain. Measured with three pills at once in three
// partitions (examples/orders' crash-pill test): 17 restarts with this rule, 27 when only
// ranges of a sixteenth of two batches ran alone, more than 30 when none did.
func (s suspect) narrowed(batchSize int) bool { return s.end-s.from < int64(batchSize) }

// holds reports whether offset o is in the range.
func (s suspect) holds(o int64) bool { return o >= s.from && o < s.end }

// pieceEnd is the end of the piece that holds o (o in the range).
func (s suspect) pieceEnd(o int64) int64 {
	return min(s.end, s.from+((o-s.from)/s.size+1)*s.size)
}

// single reports whether the piece that holds o is o alone: o's message runs as a probe.
func (s suspect) single(o int64) bool {
	return s.holds(o) && s.pieceEnd(o)-(s.from+(o-s.from)/s.size*s.size) == 1
}

// gate is the process-wide turn of a probe: units of every partition run together (enter,
// leave), a probe alone (alone, release). One per Loop.
type gate struct {
	mu      sync.Mutex
	running int           // units in flight
	probing bool          // a probe holds the gate or waits for it: no unit enters
	changed chan struct{} // closed and replaced on every change
}

func newGate() *gate { return &gate{changed: make(chan struct{})} }

// signal wakes the waiters; g.mu is held.
func (g *gate) signal() {
	close(g.changed)
	g.changed = make(chan struct{})
}

// wait releases g.mu, waits for a change or stop (errStopped), and takes g.mu again unless
// stopped.
func (g *gate) wait(stop <-chan struct{}, timeout <-chan time.Time) (timedOut bool, err error) {
	ch := g.changed
	g.mu.Unlock()
	select {
	case <-ch:
	case <-stop:
		return false, errStopped
	case <-timeout:
		g.mu.Lock()
		return true, nil
	}
	g.mu.Lock()
	return false, nil
}

// enter counts a unit in once no probe holds or waits for the gate; errStopped when stop
// closed first.
func (g *gate) enter(stop <-chan struct{}) error {
	g.mu.Lock()
	for g.probing {
		if _, err := g.wait(stop, nil); err != nil {
			return err
		}
	}
	g.running++
	g.mu.Unlock()
	return nil
}

// leave counts a unit out.
func (g *gate) leave() {
	g.mu.Lock()
	g.running--
	if g.probing && g.running == 0 {
		g.signal()
	}
	g.mu.Unlock()
}

// alone takes the gate for a probe: it waits for its turn (one probe at a time), keeps new
// units out, and waits for those in flight to end. It reports false when bound (> 0) passed
// first — a unit stuck in its handler — and the probe then runs with the others, uncounted;
// errStopped when stop closed first. After true, release gives the gate back.
func (g *gate) alone(stop <-chan struct{}, bound time.Duration) (bool, error) {
	var timeout <-chan time.Time
	if bound > 0 {
		t := time.NewTimer(bound)
		defer t.Stop()
		timeout = t.C
	}
	g.mu.Lock()
	for g.probing {
		timedOut, err := g.wait(stop, timeout)
		if err != nil || timedOut {
			if timedOut {
				g.mu.Unlock()
			}
			return false, err
		}
	}
	g.probing = true
	for g.running > 0 {
		timedOut, err := g.wait(stop, timeout)
		if err != nil || timedOut {
			if err != nil {
				g.mu.Lock()
			}
			g.probing = false
			g.signal()
			g.mu.Unlock()
			return false, err
		}
	}
	g.mu.Unlock()
	return true, nil
}

// release ends a probe's turn.
func (g *gate) release() {
	g.mu.Lock()
	g.probing = false
	g.signal()
	g.mu.Unlock()
}
