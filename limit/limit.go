// Package limit bounds the calls in flight to a far side (an HTTP API, an orchestrator, any
// service a consumer calls before its transaction) with a limit that adapts to what the far
// side can take, measured from the latency and the errors of the calls themselves — the
// gradient algorithm of Netflix's concurrency-limits (Gradient2) and Envoy's adaptive
// concurrency filter, with a slow start and a periodic probe of the latency without load.
//
// A caller takes a permit with Acquire before a call and gives it back with Permit.Done after,
// saying how the call went (Success, Dropped, Ignored). Time waiting for a permit is not the
// call's: a caller starts the call's own timeout after Acquire returns.
//
// # The rule
//
// The limit L (Config.Initial at the start) is updated once per window, about one round trip:
// a window counts only the calls started after it opened (under its limit) and closes when
// min(10, L/2) of them have completed, or one was dropped. With avg the mean latency of the
// window's successful calls and base the latency without load:
//
//   - a call in the window was Dropped (a timeout, 429, 5xx, refused connection): L = L × 0.5,
//     at most once per window (the multiplicative decrease of AIMD);
//   - the calls in flight never reached L/2 in the window: L stays (nothing says the far side
//     could take more);
//   - slow start, until the first window with avg > 1.25 × base or a drop: L = 2L;
//   - else L = L × g + √L, g = Tolerance × base / avg clamped to [0.5, 1] (Gradient2):
//     L grows by √L per window while the latency stays within Tolerance (1.5 by default)
//     × base and shrinks as queueing at the far side raises it; near the limit that last
//     dropped calls (above 0.9 of it) it grows by 1 a window instead of √L.
//
// L stays within [Config.Min, Config.Max]. base is the lowest window mean seen, measured
// again every Config.ProbeInterval (the first after ProbeFirst): the limit is held at
// ProbeLimit until ProbeSamples calls started under it complete, and base is their median —
// without a probe, a base measured while the far side queued would stay too high and let L
// creep up. Against a far side whose latency grows with its queue (one CPU-bound API worker:
// ~30 ms a call at one in flight) L settles at a few calls in flight; against one that
// answers in constant time it grows to Config.Max.
package limit

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"
)

// Defaults of Config's fields.
const (
	DefaultInitial       = 4
	DefaultMin           = 1
	DefaultMax           = 256
	DefaultTolerance     = 1.5
	DefaultProbeInterval = time.Minute
	DefaultProbeFirst    = 10 * time.Second
	// ProbeLimit is the limit held during a probe of the latency without load: 2 calls.
	ProbeLimit = 2
	// ProbeSamples is how many calls started under a probe measure the latency without load.
	ProbeSamples = 5
)

// Config configures a Limiter. The zero value takes every default.
type Config struct {
	// Initial is the limit at the start, in calls in flight. Defaults to DefaultInitial (4);
	// clamped to [Min, Max].
	Initial int
	// Min is the lowest limit, in calls in flight, ≥ 1. Defaults to DefaultMin (1).
	Min int
	// Max is the highest limit, in calls in flight, ≥ Min. Defaults to DefaultMax (256).
	// Min == Max is a fixed limit: nothing adapts (see Fixed).
	Max int
	// Tolerance is how much slower than the latency without load a call may be before the
	// limit shrinks, as a ratio > 1. Defaults to DefaultTolerance (1.5).
	Tolerance float64
	// ProbeInterval is how often the latency without load is measured again. Defaults to
	// DefaultProbeInterval (1 minute); negative: never after the first.
	ProbeInterval time.Duration
	// ProbeFirst is when the first probe runs, after the first call. Defaults to
	// DefaultProbeFirst (10 s); negative: none (base is the lowest window mean seen).
	ProbeFirst time.Duration
}

// Outcome is how a call went, for Permit.Done.
type Outcome int

const (
	// Success: the far side answered (any answer that is not overload, a 4xx included); its
	// latency is a sample.
	Success Outcome = iota
	// Dropped: the far side is overloaded or failing — a timeout, 429, 503, any 5xx, a
	// refused or reset connection; the limit shrinks.
	Dropped
	// Ignored: the call says nothing about the far side's speed (the caller's context
	// ended, the request could not be built); the permit is given back and nothing else.
	Ignored
)

// Limiter bounds calls in flight with an adaptive limit (see the package documentation). It
// is safe for concurrent use; one Limiter per far side, shared by every caller of the process.
type Limiter struct {
	cfg Config
	now func() time.Time

	mu       sync.Mutex
	limit    float64
	inflight int
	waiters  []chan struct{} // FIFO; a waiter's channel is closed when it is granted a permit

	started     time.Time // first Acquire; zero before
	windowStart time.Time
	winN        int
	winSum      time.Duration
	winDrop     bool
	winMaxIn    int
	slowStart   bool
	dropAt      float64       // the limit when calls were last dropped; 0 before
	base        time.Duration // latency without load: the lowest window mean, or a probe's median; 0 before

	probing    bool
	probeSince time.Time
	probeSaved float64
	probeRTTs  []time.Duration
	nextProbe  time.Time // zero: none planned
}

// New returns a Limiter for cfg, or an error naming the field out of range.
func New(cfg Config) (*Limiter, error) {
	if cfg.Min == 0 {
		cfg.Min = DefaultMin
	}
	if cfg.Max == 0 {
		cfg.Max = max(DefaultMax, cfg.Min)
	}
	if cfg.Initial == 0 {
		cfg.Initial = DefaultInitial
	}
	if cfg.Tolerance == 0 {
		cfg.Tolerance = DefaultTolerance
	}
	if cfg.ProbeInterval == 0 {
		cfg.ProbeInterval = DefaultProbeInterval
	}
	if cfg.ProbeFirst == 0 {
		cfg.ProbeFirst = DefaultProbeFirst
	}
	switch {
	case cfg.Min < 1:
		return nil, fmt.Errorf("limit: Config.Min %d: want ≥ 1", cfg.Min)
	case cfg.Max < cfg.Min:
		return nil, fmt.Errorf("limit: Config.Max %d is below Config.Min %d", cfg.Max, cfg.Min)
	case cfg.Initial < 0:
		return nil, fmt.Errorf("limit: Config.Initial %d: want ≥ 0", cfg.Initial)
	case cfg.Tolerance <= 1 || math.IsNaN(cfg.Tolerance) || math.IsInf(cfg.Tolerance, 0):
		return nil, fmt.Errorf("limit: Config.Tolerance %v: want a ratio > 1", cfg.Tolerance)
	}
	cfg.Initial = min(max(cfg.Initial, cfg.Min), cfg.Max)
	return &Limiter{cfg: cfg, now: time.Now, limit: float64(cfg.Initial), slowStart: true}, nil
}

// Fixed returns a Limiter whose limit is n calls in flight and never changes (n ≥ 1).
func Fixed(n int) *Limiter {
	n = max(n, 1)
	l, _ := New(Config{Initial: n, Min: n, Max: n, ProbeFirst: -1, ProbeInterval: -1})
	return l
}

// MustNew is New for a cfg known to be valid; it panics on an error.
func MustNew(cfg Config) *Limiter {
	l, err := New(cfg)
	if err != nil {
		panic(err)
	}
	return l
}

// Limit returns the current limit, in calls in flight.
func (l *Limiter) Limit() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.allowed()
}

// InFlight returns the calls holding a permit now.
func (l *Limiter) InFlight() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.inflight
}

// Waiting returns the callers waiting for a permit now.
func (l *Limiter) Waiting() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.waiters)
}

// Config returns the limiter's configuration with its defaults applied.
func (l *Limiter) Config() Config { return l.cfg }

// allowed is the limit as a count of calls; mu held.
func (l *Limiter) allowed() int {
	if l.probing {
		return min(ProbeLimit, int(l.probeSaved))
	}
	return int(l.limit)
}

// Permit is one call's hold on a Limiter; give it back with Done.
type Permit struct {
	l     *Limiter
	start time.Time
	once  sync.Once
}

// Acquire waits for a permit, first come first served, and returns it; the call starts when
// it returns (its latency is measured from then). err is ctx's error when ctx ends first.
func (l *Limiter) Acquire(ctx context.Context) (*Permit, error) {
	l.mu.Lock()
	l.begin()
	if p := l.tryGrant(); p != nil {
		l.mu.Unlock()
		return p, nil
	}
	ch := make(chan struct{})
	l.waiters = append(l.waiters, ch)
	l.mu.Unlock()
	select {
	case <-ch:
		l.mu.Lock()
		p := &Permit{l: l, start: l.now()}
		l.mu.Unlock()
		return p, nil
	case <-ctx.Done():
		l.mu.Lock()
		for i, w := range l.waiters {
			if w == ch {
				l.waiters = append(l.waiters[:i], l.waiters[i+1:]...)
				l.mu.Unlock()
				return nil, context.Cause(ctx)
			}
		}
		// Granted while ctx ended: give the permit back.
		l.inflight--
		l.wake()
		l.mu.Unlock()
		return nil, context.Cause(ctx)
	}
}

// begin starts the clock at the first Acquire; mu held.
func (l *Limiter) begin() {
	if !l.started.IsZero() {
		return
	}
	l.started = l.now()
	l.windowStart = l.started
	if l.cfg.ProbeFirst > 0 && l.cfg.Min < l.cfg.Max {
		l.nextProbe = l.started.Add(l.cfg.ProbeFirst)
	}
}

// TryAcquire returns a permit at once when one is free and no one waits, else nil.
func (l *Limiter) TryAcquire() *Permit {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.begin()
	return l.tryGrant()
}

// tryGrant counts a call in flight and returns its permit when no one waits and the limit
// allows, else nil; mu held.
func (l *Limiter) tryGrant() *Permit {
	if len(l.waiters) > 0 || l.inflight >= l.allowed() {
		return nil
	}
	l.inflight++
	l.winMaxIn = max(l.winMaxIn, l.inflight)
	return &Permit{l: l, start: l.now()}
}

// wake grants permits to waiters while the limit allows; mu held.
func (l *Limiter) wake() {
	for len(l.waiters) > 0 && l.inflight < l.allowed() {
		ch := l.waiters[0]
		l.waiters = l.waiters[1:]
		l.inflight++
		l.winMaxIn = max(l.winMaxIn, l.inflight)
		close(ch)
	}
}

// Done gives the permit back, with how the call went; calls after the first do nothing.
func (p *Permit) Done(o Outcome) {
	if p == nil {
		return
	}
	p.once.Do(func() {
		l := p.l
		l.mu.Lock()
		defer l.mu.Unlock()
		l.inflight--
		if o != Ignored && l.cfg.Min < l.cfg.Max {
			l.sample(p.start, l.now(), o == Dropped)
		}
		l.wake()
	})
}

// sample feeds one call that started at start and ended at end into the limit; mu held.
func (l *Limiter) sample(start, end time.Time, dropped bool) {
	rtt := max(end.Sub(start), time.Microsecond)
	if l.probing {
		if !start.Before(l.probeSince) && !dropped {
			l.probeRTTs = append(l.probeRTTs, rtt)
		}
		if dropped || len(l.probeRTTs) >= ProbeSamples || end.Sub(l.probeSince) > 30*time.Second {
			if n := len(l.probeRTTs); n > 0 {
				slices.Sort(l.probeRTTs)
				l.base = l.probeRTTs[n/2] // the median: one lucky call on a busy machine is not the far side's speed
			}
			l.probing = false
			l.limit = l.probeSaved
			l.planProbe(end)
			l.openWindow(end)
		}
		return
	}
	if dropped {
		l.winDrop = true
	}
	if start.Before(l.windowStart) {
		return // a call started under an earlier limit: its latency says nothing of this one
	}
	if !dropped {
		l.winN++
		l.winSum += rtt
	}
	if !l.winDrop && l.winN < min(10, max(1, int(l.limit)/2)) {
		return // the window has not seen enough of the calls started under its limit
	}
	l.update()
	l.openWindow(end)
	if !l.nextProbe.IsZero() && !end.Before(l.nextProbe) {
		l.probing, l.probeSince, l.probeSaved, l.probeRTTs = true, end, l.limit, l.probeRTTs[:0]
	}
}

// update applies the rule of the package documentation to the closing window; mu held.
func (l *Limiter) update() {
	lim := l.limit
	switch {
	case l.winDrop:
		l.dropAt = lim
		lim = lim * 0.5
		l.slowStart = false
	case l.winN == 0 || float64(l.winMaxIn)*2 < lim:
		// Nothing measured, or the callers did not use half the limit.
	default:
		avg := l.winSum / time.Duration(l.winN)
		if l.base == 0 || avg < l.base {
			l.base = avg
		}
		if l.slowStart && float64(avg) <= 1.25*float64(l.base) {
			lim = lim * 2
			break
		}
		l.slowStart = false
		g := l.cfg.Tolerance * float64(l.base) / float64(avg)
		g = min(max(g, 0.5), 1)
		head := math.Sqrt(lim)
		if l.dropAt > 0 && lim+head > 0.9*l.dropAt {
			head = 1 // near the limit that last dropped calls: one more a window
		}
		lim = lim*g + head
	}
	l.limit = min(max(lim, float64(l.cfg.Min)), float64(l.cfg.Max))
	if int(l.limit) >= l.cfg.Max {
		l.slowStart = false
	}
}

// openWindow starts a new window at t; mu held.
func (l *Limiter) openWindow(t time.Time) {
	l.windowStart, l.winN, l.winSum, l.winDrop, l.winMaxIn = t, 0, 0, false, l.inflight
}

// planProbe plans the next probe after one ended at t; mu held.
func (l *Limiter) planProbe(t time.Time) {
	if l.cfg.ProbeInterval < 0 {
		l.nextProbe = time.Time{}
		return
	}
	l.nextProbe = t.Add(l.cfg.ProbeInterval)
}
