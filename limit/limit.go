// Package limit bounds the calls in flight to a far side (an HTTP API, an orchestrator, any
// service a consumer calls before its transaction) with a limit that adapts to what the far
// side can take, measured from the latency and the errors of the calls themselves — the
// gradient algorithm of Netflix's concurrency-limits (Gradient2) and Envoy's adaptive
// concurrency filter, with a slow start and a periodic probe of the latency without load.
//
// A caller takes a permit with Acquire before a call and gives it back with Permit.Done after,
// saying how the call went (Success, Dropped, Overloaded, Ignored). Time waiting for a permit
// is not the call's: a caller starts the call's own timeout after Acquire returns. A call made
// for one key — a Kafka record key, a tenant, a row — says so (WithKey on Acquire's context, or
// Permit.DoneKey), so that one key's refusals are told from the far side's (see "One key's
// refusals" below).
//
// # The rule
//
// The limit L (Config.Initial at the start) is updated once per window, about one round trip:
// a window counts only the calls started after it opened (under its limit) and closes when
// min(10, L/2) of them have completed, or one was refused (a refusal that counts: below).
// With avg the mean latency of the window's successful calls and base the latency without
// load:
//
//   - a call in the window was refused — Overloaded (429, a Retry-After, a refused connection),
//     or Dropped (a timeout, a 5xx) and not a repeat of its key's refusal (below): L = L × 0.5,
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
//
// # One key's refusals
//
// A far side that refuses one key — one tenant's service down, one row locked, a 503 for one
// record's events — refuses it on every retry, and one Limiter is shared by every key of the
// process: if each of those refusals halved L, one key in trouble would slow every key (issue
// 45: a dagtrigger at --concurrency 8 with a far side refusing one key ran the other keys at 36
// runs/s against 98), and L fell to Min whenever that key alone called. So a refusal names its key, as a hash (WithKey, Permit.DoneKey), and the
// Limiter remembers the keys refused with no success since — up to MaxRefusingKeys of them, each
// for KeyMemory after its last refusal:
//
//   - a Dropped call whose key is remembered as refusing is that key's own trouble: it neither
//     shrinks L nor closes a window nor is a latency sample (as Ignored), and the key stays
//     remembered;
//   - a Dropped call of a key not remembered — its first refusal, or its first after a success
//     — shrinks L as above, and the key is remembered;
//   - a Success of a key forgets it (it recovered);
//   - a Dropped call that names no key (no WithKey, an empty key) and an Overloaded call (the
//     far side says it is overloaded for everyone: 429, a Retry-After) always count.
//
// A failure shared by the far side's keys therefore still shrinks L as before: it refuses keys
// that were not refusing a moment ago (each key's first refusal counts, and under overload a
// key's calls alternate between success and refusal), and a far side that is down refuses each
// key in flight a first time. One key refusing every call, window after window, shrinks L once
// (its first refusal) and then never again; k keys refusing forever shrink it at most k times.
// A window alone cannot tell these apart — two keys refused in a window of ten calls look like
// a far side dropping 20% of its calls; a key refused again with no success since cannot be
// told from one key's trouble, and it is the repeats that made one key slow everyone. A
// stream of ever-new keys each refused once is counted as the far side's failure: each is a
// first refusal.
package limit

import (
	"context"
	"fmt"
	"hash/maphash"
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
	// KeyMemory is how long a key refused with no success since is remembered as refusing,
	// from its last refusal: 10 minutes, longer than the waits between a failing key's retries
	// (a consumer's backoff, Unavailable's window).
	KeyMemory = 10 * time.Minute
	// MaxRefusingKeys bounds the keys remembered as refusing (a hash of 8 bytes and a time
	// each): past it, those not refused for KeyMemory are forgotten, then arbitrary others
	// until a quarter is free; a forgotten key's next refusal counts as a first one.
	MaxRefusingKeys = 4096
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
	// Dropped: the far side refused or failed the call — a timeout, 408, 503, any 5xx; the
	// limit shrinks, unless the call names a key already refusing (see the package
	// documentation: one key's refusals).
	Dropped
	// Ignored: the call says nothing about the far side's speed (the caller's context
	// ended, the request could not be built); the permit is given back and nothing else.
	Ignored
	// Overloaded: the far side says it is overloaded for every caller — 429, an answer with
	// Retry-After, a refused or reset connection; the limit shrinks whatever key the call
	// names.
	Overloaded
)

// seed hashes keys; a process's hashes are compared only within the process.
var seed = maphash.MakeSeed()

// ctxKey is the context key of WithKey.
type ctxKey struct{}

// keyOf is a key's hash, and whether there is a key (a non-empty one).
type keyOf struct {
	hash uint64
	ok   bool
}

func hashKey(key []byte) keyOf {
	if len(key) == 0 {
		return keyOf{}
	}
	return keyOf{hash: maphash.Bytes(seed, key), ok: true}
}

// WithKey returns a copy of ctx saying that the calls made under it are for key (a Kafka
// record key, a tenant, a row: what the far side may refuse alone). A permit Acquired with
// that context carries the key's hash — the key itself is not kept — and its Done counts a
// Dropped answer as that key's refusal (package documentation: one key's refusals). An empty
// or nil key names none: WithKey(ctx, nil) takes back a key an outer caller named, for calls
// that are no key's (a token exchange).
func WithKey(ctx context.Context, key []byte) context.Context {
	return context.WithValue(ctx, ctxKey{}, hashKey(key))
}

// HasKey reports whether ctx names a key (WithKey with a non-empty key).
func HasKey(ctx context.Context) bool {
	k, _ := ctx.Value(ctxKey{}).(keyOf)
	return k.ok
}

func keyFrom(ctx context.Context) keyOf {
	k, _ := ctx.Value(ctxKey{}).(keyOf)
	return k
}

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

	refusing map[uint64]time.Time // keys refused with no success since, by their last refusal

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

// Refusing returns how many keys are remembered as refusing now: refused by the far side with
// no success since, the last refusal less than KeyMemory ago (package documentation).
func (l *Limiter) Refusing() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, now := 0, l.now()
	for _, at := range l.refusing {
		if now.Sub(at) < KeyMemory {
			n++
		}
	}
	return n
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
	key   keyOf
	once  sync.Once
}

// Acquire waits for a permit, first come first served, and returns it; the call starts when
// it returns (its latency is measured from then). The permit is for ctx's key, if ctx names
// one (WithKey). err is ctx's error when ctx ends first.
func (l *Limiter) Acquire(ctx context.Context) (*Permit, error) {
	key := keyFrom(ctx)
	l.mu.Lock()
	l.begin()
	if p := l.tryGrant(); p != nil {
		l.mu.Unlock()
		p.key = key
		return p, nil
	}
	ch := make(chan struct{})
	l.waiters = append(l.waiters, ch)
	l.mu.Unlock()
	select {
	case <-ch:
		l.mu.Lock()
		p := &Permit{l: l, start: l.now(), key: key}
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

// TryAcquire returns a permit at once when one is free and no one waits, else nil. The permit
// names no key; Permit.DoneKey gives one.
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

// Done gives the permit back, with how the call went, for the key the permit was Acquired for
// (WithKey), if any; calls after the first (of Done or DoneKey) do nothing.
func (p *Permit) Done(o Outcome) {
	if p == nil {
		return
	}
	p.done(o, p.key)
}

// DoneKey is Done for a call made for key, whatever key the permit was Acquired for: a caller
// that learns only after the call which key it was for (a batch whose one message the far side
// refused) names it here. An empty or nil key names none: the call counts as Done's with no key
// (a Dropped one shrinks the limit).
func (p *Permit) DoneKey(o Outcome, key []byte) {
	if p == nil {
		return
	}
	p.done(o, hashKey(key))
}

func (p *Permit) done(o Outcome, key keyOf) {
	p.once.Do(func() {
		l := p.l
		l.mu.Lock()
		defer l.mu.Unlock()
		l.inflight--
		if o != Ignored && l.cfg.Min < l.cfg.Max {
			now := l.now()
			if l.ownRefusal(o, key, now) {
				l.sampleOwn(now)
			} else {
				l.sample(p.start, now, o == Dropped || o == Overloaded)
			}
		}
		l.wake()
	})
}

// ownRefusal updates the keys remembered as refusing with a call of key that ended at now
// with o, and reports whether it is a repeat of key's refusal (package documentation); mu
// held.
func (l *Limiter) ownRefusal(o Outcome, key keyOf, now time.Time) bool {
	if !key.ok {
		return false
	}
	switch o {
	case Success:
		delete(l.refusing, key.hash)
		return false
	case Dropped:
		at, seen := l.refusing[key.hash]
		if !seen && len(l.refusing) >= MaxRefusingKeys {
			l.forget(now)
		}
		if l.refusing == nil {
			l.refusing = map[uint64]time.Time{}
		}
		l.refusing[key.hash] = now
		return seen && now.Sub(at) < KeyMemory
	}
	return false // Overloaded: the far side's, whoever the call was for
}

// forget makes room in the keys remembered as refusing: those refused KeyMemory ago or more,
// then arbitrary others until a quarter of MaxRefusingKeys is free; mu held.
func (l *Limiter) forget(now time.Time) {
	for k, at := range l.refusing {
		if now.Sub(at) >= KeyMemory {
			delete(l.refusing, k)
		}
	}
	for k := range l.refusing {
		if len(l.refusing) <= MaxRefusingKeys*3/4 {
			break
		}
		delete(l.refusing, k)
	}
}

// sampleOwn feeds a repeat of one key's refusal, ended at end, into the limit: nothing of the
// far side is learnt, but a probe that lasted too long ends; mu held.
func (l *Limiter) sampleOwn(end time.Time) {
	if l.probing && end.Sub(l.probeSince) > 30*time.Second {
		l.endProbe(end)
	}
}

// endProbe ends a probe at end: base is the median of its samples; mu held.
func (l *Limiter) endProbe(end time.Time) {
	if n := len(l.probeRTTs); n > 0 {
		slices.Sort(l.probeRTTs)
		l.base = l.probeRTTs[n/2] // the median: one lucky call on a busy machine is not the far side's speed
	}
	l.probing = false
	l.limit = l.probeSaved
	l.planProbe(end)
	l.openWindow(end)
}

// sample feeds one call that started at start and ended at end into the limit; mu held.
func (l *Limiter) sample(start, end time.Time, dropped bool) {
	rtt := max(end.Sub(start), time.Microsecond)
	if l.probing {
		if !start.Before(l.probeSince) && !dropped {
			l.probeRTTs = append(l.probeRTTs, rtt)
		}
		if dropped || len(l.probeRTTs) >= ProbeSamples || end.Sub(l.probeSince) > 30*time.Second {
			l.endProbe(end)
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
