package main

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// chunks produces orders with the orders binary in chunks of size, each with one poison
// pill: by hand (produce) or once a second from everySecond until stop. The failover tests
// keep a drain going across a kill with it.
type chunks struct {
	t       *testing.T
	bin     string
	args    []string
	size    int
	n       atomic.Int32
	quit    chan struct{}
	stopped chan struct{}
	once    sync.Once
}

func newChunks(t *testing.T, bin string, args []string, size int) *chunks {
	c := &chunks{t: t, bin: bin, args: args, size: size, quit: make(chan struct{}), stopped: make(chan struct{})}
	t.Cleanup(c.stop)
	return c
}

// produce writes one chunk (a failure is the test's error, not its end: the count says what
// arrived).
func (c *chunks) produce() {
	n := strconv.Itoa(c.size)
	r := runOrders(c.t, c.bin, 120*time.Second, append(c.args, "--generate", n, "--poison-every", n, "--produce-only")...)
	if r.code != 0 {
		c.t.Errorf("produce: exit %d: %s", r.code, tail(r.stderr))
		return
	}
	c.n.Add(1)
}

// everySecond produces a chunk a second until stop.
func (c *chunks) everySecond() {
	go func() {
		defer close(c.stopped)
		for {
			select {
			case <-c.quit:
				return
			case <-time.After(time.Second):
			}
			c.produce()
		}
	}()
}

// stop ends everySecond's chunks and waits for the one in progress (once; a no-op before
// everySecond).
func (c *chunks) stop() {
	c.once.Do(func() {
		close(c.quit)
		select {
		case <-c.stopped:
		case <-time.After(150 * time.Second): // never started, or a produce past its own timeout
		}
	})
}

// count is the number of chunks produced.
func (c *chunks) count() int { return int(c.n.Load()) }

// supervisor runs the orders service as a supervisor would: started again 1 s after a
// non-zero exit (a SIGKILL, a crash), done at exit 0 (--exit-when-idle). Its stderr across
// restarts is in logs.
type supervisor struct {
	logs     lockedLog
	done     chan struct{} // closed when the service exited 0, or after stop
	quit     chan struct{}
	once     sync.Once
	restarts atomic.Int32
	current  atomic.Pointer[os.Process] // the service's process now
}

func supervise(t *testing.T, bin string, args []string) *supervisor {
	s := &supervisor{done: make(chan struct{}), quit: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			cmd := exec.Command(bin, args...)
			var errOut strings.Builder
			cmd.Stderr = &errOut
			err := cmd.Start()
			if err == nil {
				s.current.Store(cmd.Process)
				w := make(chan error, 1)
				go func() { w <- cmd.Wait() }()
				select {
				case err = <-w:
				case <-s.quit:
					_ = cmd.Process.Kill()
					<-w
					s.logs.add(errOut.String())
					return
				}
			}
			s.logs.add(errOut.String())
			if err == nil {
				return
			}
			s.restarts.Add(1)
			select {
			case <-s.quit:
				return
			case <-time.After(time.Second):
			}
		}
	}()
	t.Cleanup(s.stop)
	return s
}

// stop kills the service and ends the supervision (once).
func (s *supervisor) stop() {
	s.once.Do(func() { close(s.quit) })
	<-s.done
}

// exited reports whether the service has exited 0.
func (s *supervisor) exited() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// killCurrent SIGKILLs the service's process now; the supervisor starts it again.
func (s *supervisor) killCurrent() {
	if p := s.current.Load(); p != nil {
		_ = p.Kill()
	}
}

// detail is the tail of the service's log, for a failure message.
func (s *supervisor) detail() string { return tail(s.logs.String()) }

// lockedLog collects the service's stderr across restarts (written by the supervisor,
// read by the test).
type lockedLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedLog) add(s string) { l.mu.Lock(); l.b.WriteString(s); l.mu.Unlock() }

func (l *lockedLog) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

// eventTally compares the events topic (readEventIDs: per order id, each kafkatx-outbox-id
// seen and how often) with the orders the database holds.
type eventTally struct {
	missing int // orders the database holds without an event
	ghosts  int // events of orders the database lacks
	copies  int // records past the first of one kafkatx-outbox-id
	split   int // orders whose events carry more than one kafkatx-outbox-id
	shared  int // kafkatx-outbox-ids carried by two orders
}

func tallyEvents[V any](ids map[string]map[string]int, orders map[string]V) eventTally {
	var e eventTally
	owner := map[string]string{}
	for o, hs := range ids {
		if _, ok := orders[o]; !ok {
			e.ghosts++
		}
		if len(hs) > 1 {
			e.split++
		}
		for h, n := range hs {
			e.copies += n - 1
			if w, ok := owner[h]; ok && w != o {
				e.shared++
			}
			owner[h] = o
		}
	}
	for o := range orders {
		if len(ids[o]) == 0 {
			e.missing++
		}
	}
	return e
}

// exact reports whether every order has its event once under one id, and no event is extra.
func (e eventTally) exact() bool { return e == eventTally{} }

func (e eventTally) String() string {
	return strconv.Itoa(e.missing) + " orders without an event, " + strconv.Itoa(e.ghosts) + " events of orders the database lacks, " +
		strconv.Itoa(e.copies) + " copies of an event, " + strconv.Itoa(e.split) + " orders under more than one kafkatx-outbox-id, " +
		strconv.Itoa(e.shared) + " ids carried by two orders"
}

// The tally the failover tests judge by counts each kind of mismatch (the tests themselves
// only ever see exact runs).
func TestTallyEventsCountsEachKind(t *testing.T) {
	ids := map[string]map[string]int{
		"o1":    {"a": 1},         // exact
		"o2":    {"b": 2},         // a copy
		"o3":    {"c": 1, "d": 1}, // two ids
		"o4":    {"a": 1},         // an id o1 carries too
		"ghost": {"e": 1},         // an order the database lacks
	}
	orders := map[string]bool{"o1": true, "o2": true, "o3": true, "o4": true, "o5": true} // o5: no event
	got := tallyEvents(ids, orders)
	if want := (eventTally{missing: 1, ghosts: 1, copies: 1, split: 1, shared: 1}); got != want {
		t.Fatalf("tally %+v; want %+v", got, want)
	}
	if got.exact() || !tallyEvents(map[string]map[string]int{"o1": {"a": 1}}, map[string]int{"o1": 0}).exact() {
		t.Fatal("exact() is wrong")
	}
}
