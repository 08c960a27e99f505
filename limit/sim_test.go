package limit

import (
	"math/rand/v2"
	"testing"
	"time"
)

// A discrete simulation, 1 ms a step, of callers that each take a permit (TryAcquire), make a
// call to a far side and take the next permit at once: what the limit does against far sides
// of known shapes, on a clock the test owns.

// farSide answers calls: step advances every call in flight by dt and returns those finished
// with their outcome.
type farSide interface {
	start(id int)
	step(dt time.Duration) map[int]Outcome
}

// constant answers every call after d, plus perCall for each call in flight when it started
// (a far side that slows a little under load).
type constant struct {
	d, perCall time.Duration
	left       map[int]time.Duration
}

func (c *constant) start(id int) { c.left[id] = c.d + time.Duration(len(c.left))*c.perCall }
func (c *constant) step(dt time.Duration) map[int]Outcome {
	out := map[int]Outcome{}
	for id, r := range c.left {
		if r -= dt; r <= 0 {
			out[id] = Success
			delete(c.left, id)
		} else {
			c.left[id] = r
		}
	}
	return out
}

// cpuBound is an API server with one worker shared by the calls in flight (processor
// sharing): each call needs work of CPU; n calls in flight each get 1/n of it, so a call's
// latency grows with the queue. Calls in flight over poolSize (the server's database pool)
// wait past timeout and fail: more in flight than the pool holds is the lock-up.
type cpuBound struct {
	work, timeout time.Duration
	wait          time.Duration // before its CPU work, a call waits 0.5–1.5× this long on no shared resource (database round trips)
	rnd           *rand.Rand
	waiting       map[int]time.Duration
	poolSize      int
	left          map[int]time.Duration
	age           map[int]time.Duration
	over          int // steps with more calls in flight than the pool holds
}

func (c *cpuBound) start(id int) {
	c.left[id], c.age[id] = c.work, 0
	if c.wait > 0 {
		if c.waiting == nil {
			c.waiting = map[int]time.Duration{}
		}
		if c.rnd == nil {
			c.rnd = rand.New(rand.NewPCG(1, 2))
		}
		c.waiting[id] = c.wait/2 + time.Duration(c.rnd.Int64N(int64(c.wait)))
	}
}
func (c *cpuBound) step(dt time.Duration) map[int]Outcome {
	out := map[int]Outcome{}
	if len(c.left) > c.poolSize {
		c.over++
	}
	n := 0
	for id := range c.left {
		if c.waiting[id] <= 0 {
			n++
		}
	}
	for id, r := range c.left {
		c.age[id] += dt
		if c.age[id] >= c.timeout {
			out[id] = Dropped
			delete(c.left, id)
			continue
		}
		if c.waiting[id] > 0 {
			c.waiting[id] -= dt
			continue
		}
		if r -= dt / time.Duration(n); r <= 0 {
			out[id] = Success
			delete(c.left, id)
		} else {
			c.left[id] = r
		}
	}
	return out
}

type simResult struct {
	done      int           // successful calls
	limits    []int         // the limit at every step
	inflight  []int         // calls in flight at every step
	maxLimit  int           // highest limit after warm
	lastLimit int           // the limit at the end
	over      time.Duration // time with more calls in flight than the far side's pool
}

// simulate runs callers against far for d (virtual time) and reports.
func simulate(t *testing.T, cfg Config, far farSide, callers int, d, warm time.Duration) simResult {
	t.Helper()
	return simulateKeyed(t, cfg, far, callers, d, warm, nil)
}

// simulateKeyed is simulate with each call naming a key: key(id) for caller id's call (nil:
// none), given with Permit.DoneKey.
func simulateKeyed(t *testing.T, cfg Config, far farSide, callers int, d, warm time.Duration, key func(id int) []byte) simResult {
	t.Helper()
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	l.now = func() time.Time { return now }
	permits := map[int]*Permit{}
	idle := make([]int, 0, callers)
	for i := range callers {
		idle = append(idle, i)
	}
	var r simResult
	const dt = time.Millisecond
	for el := time.Duration(0); el < d; el += dt {
		for len(idle) > 0 {
			p := l.TryAcquire()
			if p == nil {
				break
			}
			id := idle[0]
			idle = idle[1:]
			permits[id] = p
			far.start(id)
		}
		now = now.Add(dt)
		for id, o := range far.step(dt) {
			if o == Success {
				r.done++
			}
			if key != nil {
				permits[id].DoneKey(o, key(id))
			} else {
				permits[id].Done(o)
			}
			delete(permits, id)
			idle = append(idle, id)
		}
		lim := l.Limit()
		r.limits = append(r.limits, lim)
		r.inflight = append(r.inflight, len(permits))
		if el >= warm {
			r.maxLimit = max(r.maxLimit, lim)
		}
	}
	r.lastLimit = l.Limit()
	if c, ok := far.(*cpuBound); ok {
		r.over = time.Duration(c.over) * dt
	}
	return r
}

// TestLimitSettlesLowAgainstAQueueingServer: 96 callers (16 lanes × 6 partitions, the old
// default) against one API worker at 30 ms of CPU a call with a pool of 15 (a default Airflow
// 3.3.2: SQLAlchemy pool 5 + overflow 10) never hold more than the pool, never time out, and
// keep the worker busy: the throughput is that of the worker (33 calls/s).
func TestLimitSettlesLowAgainstAQueueingServer(t *testing.T) {
	far := &cpuBound{work: 30 * time.Millisecond, timeout: 10 * time.Second, poolSize: 15, left: map[int]time.Duration{}, age: map[int]time.Duration{}}
	r := simulate(t, Config{}, far, 96, 90*time.Second, 5*time.Second)
	if r.over > 0 {
		t.Errorf("more calls in flight than the far side's pool of 15 for %v", r.over)
	}
	if r.maxLimit > 15 {
		t.Errorf("limit reached %d after the first 5 s, want ≤ 15", r.maxLimit)
	}
	if r.lastLimit < 2 {
		t.Errorf("limit ended at %d: the worker idles between calls", r.lastLimit)
	}
	capacity := int(90 * time.Second / (30 * time.Millisecond))
	if r.done < capacity*9/10 {
		t.Errorf("%d calls done in 90 s, want ≥ 90%% of the worker's %d", r.done, capacity)
	}
	t.Logf("done %d of %d, max limit after 5 s %d, last %d", r.done, capacity, r.maxLimit, r.lastLimit)
}

// TestLimitFillsAServerThatAlsoWaits: calls that wait 80 ms (database round trips) besides
// their 36 ms of the one worker's CPU — what one api-server worker of Airflow 3.3.2 measured
// on this machine: ~116 ms alone, ~28 runs/s at best — need 4 or more in flight to keep the
// worker busy: the limit gets ≥ 90% of the worker's throughput and stays within the pool.
func TestLimitFillsAServerThatAlsoWaits(t *testing.T) {
	far := &cpuBound{work: 36 * time.Millisecond, wait: 80 * time.Millisecond, timeout: 10 * time.Second, poolSize: 15, left: map[int]time.Duration{}, age: map[int]time.Duration{}}
	r := simulate(t, Config{}, far, 96, 90*time.Second, 5*time.Second)
	capacity := int(90 * time.Second / (36 * time.Millisecond))
	if r.over > 0 || r.maxLimit > 15 {
		t.Errorf("over the pool of 15 for %v; limit reached %d after 5 s", r.over, r.maxLimit)
	}
	if r.done < capacity*9/10 {
		t.Errorf("%d calls done in 90 s, want ≥ 90%% of the worker's %d", r.done, capacity)
	}
	t.Logf("done %d of %d, max limit after 5 s %d, last %d", r.done, capacity, r.maxLimit, r.lastLimit)
}

// TestLimitGrowsAgainstAConstantFarSide: a far side answering every call in 200 ms without
// errors lets the limit grow to Max within a few seconds, probes included.
func TestLimitGrowsAgainstAConstantFarSide(t *testing.T) {
	far := &constant{d: 200 * time.Millisecond, left: map[int]time.Duration{}}
	r := simulate(t, Config{}, far, 192, 90*time.Second, 0)
	reached := -1
	for i, lim := range r.limits {
		if lim >= 192 {
			reached = i
			break
		}
	}
	if reached < 0 || reached > 3000 {
		t.Fatalf("the limit reached 192 at step %d (ms), want within 3 s; last %d", reached, r.lastLimit)
	}
	// Over 90 s, with probes every minute, the callers get ≥ 95% of what 192 in flight give.
	want := int(90*time.Second/(200*time.Millisecond)) * 192 * 95 / 100
	if r.done < want {
		t.Errorf("%d calls done, want ≥ %d", r.done, want)
	}
	t.Logf("192 reached after %d ms; %d calls done", reached, r.done)
}

// TestLimitGrowsAgainstAFarSideSlowingALittle: 200 ms plus 1 ms per call in flight (at 130
// in flight, 330 ms) still lets the limit grow past 100.
func TestLimitGrowsAgainstAFarSideSlowingALittle(t *testing.T) {
	far := &constant{d: 200 * time.Millisecond, perCall: time.Millisecond, left: map[int]time.Duration{}}
	r := simulate(t, Config{}, far, 192, 60*time.Second, 0)
	low := 192
	for _, lim := range r.limits[5000:] {
		low = min(low, lim)
	}
	// The probes (every minute, the first at 10 s) hold 2 for a moment: skip their steps.
	steady := 0
	for _, lim := range r.limits[5000:] {
		if lim >= 100 {
			steady++
		}
	}
	if steady < len(r.limits[5000:])*95/100 {
		t.Errorf("limit ≥ 100 for %d of %d ms after the first 5 s; last %d", steady, len(r.limits[5000:]), r.lastLimit)
	}
	t.Logf("last limit %d, lowest after 5 s %d (a probe)", r.lastLimit, low)
}

// TestLimitShrinksOnDrops: a far side that fails calls (timeouts, 5xx) when more than 10 are in
// flight makes the limit halve on each window with a drop and stay near 10.
func TestLimitShrinksOnDrops(t *testing.T) {
	far := &dropping{cap: 10, d: 50 * time.Millisecond, left: map[int]time.Duration{}}
	r := simulate(t, Config{}, far, 64, 60*time.Second, 0)
	above := 0
	for _, in := range r.inflight[5000:] {
		if in > 20 {
			above++
		}
	}
	if above > 0 {
		t.Errorf("more than 20 in flight for %d ms after the first 5 s", above)
	}
	if far.drops*20 > far.calls {
		t.Errorf("%d of %d calls dropped, want < 5%%", far.drops, far.calls)
	}
	if r.lastLimit < 4 {
		t.Errorf("limit ended at %d, want near the far side's 10", r.lastLimit)
	}
	t.Logf("%d calls, %d dropped, last limit %d", far.calls, far.drops, r.lastLimit)
}

// dropping answers in d while at most cap calls are in flight and fails a call started over it.
type dropping struct {
	cap         int
	d           time.Duration
	left        map[int]time.Duration
	fail        map[int]bool
	calls, drop int
	drops       int
}

func (c *dropping) start(id int) {
	if c.fail == nil {
		c.fail = map[int]bool{}
	}
	c.calls++
	c.fail[id] = len(c.left) >= c.cap
	c.left[id] = c.d
}
func (c *dropping) step(dt time.Duration) map[int]Outcome {
	out := map[int]Outcome{}
	for id, r := range c.left {
		if r -= dt; r <= 0 {
			out[id] = Success
			if c.fail[id] {
				out[id] = Dropped
				c.drops++
			}
			delete(c.left, id)
		} else {
			c.left[id] = r
		}
	}
	return out
}

// TestLimitDoesNotGrowUnused: three callers never make the limit grow past twice their number.
func TestLimitDoesNotGrowUnused(t *testing.T) {
	far := &constant{d: 10 * time.Millisecond, left: map[int]time.Duration{}}
	r := simulate(t, Config{}, far, 3, 30*time.Second, 0)
	if r.maxLimit > 8 {
		t.Errorf("limit grew to %d with 3 callers", r.maxLimit)
	}
}

// TestFixedLimitNeverMoves: Fixed(n) holds n whatever the far side does.
func TestFixedLimitNeverMoves(t *testing.T) {
	far := &cpuBound{work: 30 * time.Millisecond, timeout: time.Second, poolSize: 1000, left: map[int]time.Duration{}, age: map[int]time.Duration{}}
	l := Fixed(7)
	cfg := l.Config()
	r := simulate(t, cfg, far, 50, 20*time.Second, 0)
	for i, lim := range r.limits {
		if lim != 7 {
			t.Fatalf("step %d: limit %d, want 7", i, lim)
		}
	}
}
