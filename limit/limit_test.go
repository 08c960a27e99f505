package limit

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestAcquireWaitsForAPermitAndCtxEndsTheWait(t *testing.T) {
	l := Fixed(2)
	p1, _ := l.Acquire(context.Background())
	p2, _ := l.Acquire(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := l.Acquire(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("third Acquire with 2 in flight: %v, want the context's deadline", err)
	}
	if l.Waiting() != 0 {
		t.Fatalf("a waiter whose context ended is still queued")
	}
	got := make(chan *Permit)
	go func() { p, _ := l.Acquire(context.Background()); got <- p }()
	select {
	case <-got:
		t.Fatal("granted while the limit was used")
	case <-time.After(30 * time.Millisecond):
	}
	p1.Done(Success)
	p1.Done(Success) // a second Done gives nothing back twice
	p3 := <-got
	if in := l.InFlight(); in != 2 {
		t.Fatalf("in flight %d, want 2", in)
	}
	p2.Done(Ignored)
	p3.Done(Dropped)
	if in := l.InFlight(); in != 0 {
		t.Fatalf("in flight %d after every Done, want 0", in)
	}
}

func TestWaitersAreServedInOrder(t *testing.T) {
	l := Fixed(1)
	p, _ := l.Acquire(context.Background())
	var order []int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			q, _ := l.Acquire(context.Background())
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			q.Done(Success)
		}()
		for l.Waiting() != i+1 {
			time.Sleep(time.Millisecond)
		}
	}
	p.Done(Success)
	wg.Wait()
	for i, v := range order {
		if v != i {
			t.Fatalf("served in order %v, want 0..4", order)
		}
	}
}

// TestNeverMoreInFlightThanTheLimit: many goroutines against an adaptive limiter with a
// small Max never hold more permits than the limit allows (run with -race).
func TestNeverMoreInFlightThanTheLimit(t *testing.T) {
	l := MustNew(Config{Max: 8, ProbeFirst: 5 * time.Millisecond, ProbeInterval: 20 * time.Millisecond})
	var in, worst atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 40 {
				p, err := l.Acquire(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				n := in.Add(1)
				for {
					w := worst.Load()
					if n <= w || worst.CompareAndSwap(w, n) {
						break
					}
				}
				time.Sleep(200 * time.Microsecond)
				in.Add(-1)
				p.Done(Success)
			}
		}()
	}
	wg.Wait()
	if w := worst.Load(); w > 8 {
		t.Fatalf("%d in flight at once, Max 8", w)
	}
	if l.InFlight() != 0 || l.Waiting() != 0 {
		t.Fatalf("in flight %d, waiting %d after all returned", l.InFlight(), l.Waiting())
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Min: -1}, "Config.Min"},
		{Config{Min: 10, Max: 5}, "Config.Max"},
		{Config{Initial: -3}, "Config.Initial"},
		{Config{Tolerance: 0.9}, "Config.Tolerance"},
	} {
		if _, err := New(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v) = %v, want an error naming %s", c.cfg, err, c.want)
		}
	}
	l := MustNew(Config{})
	if c := l.Config(); c.Initial != DefaultInitial || c.Min != DefaultMin || c.Max != DefaultMax || l.Limit() != DefaultInitial {
		t.Fatalf("defaults: %+v, limit %d", c, l.Limit())
	}
}
