package limit

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"
)

// clocked returns a limiter for cfg on a clock the test moves with the returned function.
func clocked(t *testing.T, cfg Config) (*Limiter, func(time.Duration)) {
	t.Helper()
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	l.now = func() time.Time { return now }
	return l, func(d time.Duration) { now = now.Add(d) }
}

// window runs one window by hand: it takes every permit the limit allows, lets 10 ms pass,
// then gives them back, the refused first — refused[i] names the key of a refused call
// (DoneKey Dropped; "" for a refusal naming no key) — then the rest as successes (enough to
// close a window). It returns the limit after the window.
func window(t *testing.T, l *Limiter, tick func(time.Duration), refused ...string) int {
	t.Helper()
	tick(time.Millisecond) // calls start after the window opened
	var ps []*Permit
	for p := l.TryAcquire(); p != nil; p = l.TryAcquire() {
		ps = append(ps, p)
	}
	if len(ps) < len(refused)+2 {
		t.Fatalf("only %d permits at limit %d for %d refusals", len(ps), l.Limit(), len(refused))
	}
	tick(10 * time.Millisecond)
	for i, k := range refused {
		ps[i].DoneKey(Dropped, []byte(k))
	}
	for i, p := range ps[len(refused):] {
		p.DoneKey(Success, []byte(fmt.Sprintf("other-%d", i)))
	}
	return l.Limit()
}

// noProbe is a configuration whose limit moves only by the window rule.
var noProbe = Config{Initial: 64, Max: 256, ProbeFirst: -1, ProbeInterval: -1}

// TestOneKeyRefusingEveryWindowDoesNotShrinkTheLimit: a key refused in every window, with no
// success between, shrinks the limit once — its first refusal — and never again; a refusal
// naming no key still halves it at once.
func TestOneKeyRefusingEveryWindowDoesNotShrinkTheLimit(t *testing.T) {
	l, tick := clocked(t, noProbe)
	first := window(t, l, tick, "tenant-7")
	if first != 32 {
		t.Fatalf("after the key's first refusal: limit %d, want 64 halved (32)", first)
	}
	last := first
	for w := range 40 {
		lim := window(t, l, tick, "tenant-7")
		if lim < last {
			t.Fatalf("window %d: the key refused again and the limit fell from %d to %d", w, last, lim)
		}
		last = lim
	}
	if last <= first {
		t.Fatalf("limit %d after 40 windows of one refusing key, want grown above %d", last, first)
	}
	if n := l.Refusing(); n != 1 {
		t.Fatalf("Refusing() = %d, want the one key", n)
	}
	if lim := window(t, l, tick, ""); lim != last/2 {
		t.Fatalf("a refusal naming no key: limit %d, want %d halved", lim, last)
	}
}

// TestManyKeysRefusingShrinkTheLimitAsWithoutKeys: a refusal of a different key in each window
// (a far side failing for everyone, met by new keys) halves the limit on every window, exactly
// as refusals naming no key do.
func TestManyKeysRefusingShrinkTheLimitAsWithoutKeys(t *testing.T) {
	keyed, tk := clocked(t, noProbe)
	unkeyed, tu := clocked(t, noProbe)
	for w := range 4 {
		a := window(t, keyed, tk, fmt.Sprintf("key-%d", w), fmt.Sprintf("key-%d-b", w))
		b := window(t, unkeyed, tu, "", "")
		if want := 64 >> (w + 1); a != want || b != want {
			t.Fatalf("window %d: keyed %d, unkeyed %d, want both %d", w, a, b, want)
		}
	}
}

// TestMixedRefusals: with one key refusing all along, a window with a refusal of another key
// still halves the limit; a key that succeeded is forgotten and its next refusal counts again;
// an Overloaded answer (429) counts whatever its key; a key's memory ends after KeyMemory.
func TestMixedRefusals(t *testing.T) {
	l, tick := clocked(t, noProbe)
	lim := window(t, l, tick, "stuck") // first refusal: 32
	if lim2 := window(t, l, tick, "stuck"); lim2 < lim {
		t.Fatalf("a repeat refusal shrank the limit: %d → %d", lim, lim2)
	}
	lim = window(t, l, tick, "stuck")
	if got := window(t, l, tick, "stuck", "fresh"); got != lim/2 {
		t.Fatalf("a new key refused beside the stuck one: limit %d, want %d halved", got, lim)
	}
	lim = window(t, l, tick, "stuck", "fresh") // both repeats now
	if got := window(t, l, tick, "stuck", "fresh"); got < lim {
		t.Fatalf("repeats of two refusing keys shrank the limit: %d → %d", lim, got)
	}
	// "fresh" succeeds: forgotten; its next refusal is a first one again.
	tick(time.Millisecond)
	p, _ := l.Acquire(WithKey(context.Background(), []byte("fresh")))
	p.Done(Success)
	if n := l.Refusing(); n != 1 {
		t.Fatalf("Refusing() = %d after the key's success, want 1 (stuck)", n)
	}
	lim = l.Limit()
	if got := window(t, l, tick, "fresh"); got != lim/2 {
		t.Fatalf("a key refused again after a success: limit %d, want %d halved", got, lim)
	}
	// Overloaded (429, Retry-After) is the far side's, whatever the key.
	lim = window(t, l, tick, "stuck")
	tick(time.Millisecond)
	var ps []*Permit
	for p := l.TryAcquire(); p != nil; p = l.TryAcquire() {
		ps = append(ps, p)
	}
	tick(10 * time.Millisecond)
	ps[0].DoneKey(Overloaded, []byte("stuck"))
	for _, p := range ps[1:] {
		p.Done(Success)
	}
	if got := l.Limit(); got != lim/2 {
		t.Fatalf("a 429 for a refusing key: limit %d, want %d halved", got, lim)
	}
	// After KeyMemory without a refusal, the stuck key's next refusal is a first one again.
	window(t, l, tick, "stuck")
	tick(KeyMemory)
	lim = l.Limit()
	if got := window(t, l, tick, "stuck"); got != lim/2 {
		t.Fatalf("a key refused again after KeyMemory: limit %d, want %d halved", got, lim)
	}
}

// TestAcquireCarriesTheContextsKey: a permit Acquired under WithKey is that key's (its Done
// counts the key's refusals); WithKey(ctx, nil) names none again, and so does an empty key.
func TestAcquireCarriesTheContextsKey(t *testing.T) {
	l, tick := clocked(t, noProbe)
	ctx := WithKey(context.Background(), []byte("k"))
	if !HasKey(ctx) || HasKey(WithKey(ctx, nil)) || HasKey(WithKey(ctx, []byte{})) || HasKey(context.Background()) {
		t.Fatal("HasKey does not follow WithKey")
	}
	refuse := func(ctx context.Context) int {
		tick(time.Millisecond)
		var ps []*Permit
		for {
			p, err := l.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			ps = append(ps, p)
			if l.InFlight() == l.Limit() {
				break
			}
		}
		tick(10 * time.Millisecond)
		ps[0].Done(Dropped)
		for _, p := range ps[1:] {
			p.DoneKey(Success, []byte("other"))
		}
		return l.Limit()
	}
	if got := refuse(ctx); got != 32 {
		t.Fatalf("first refusal of k: %d, want 32", got)
	}
	if got := refuse(ctx); got < 32 {
		t.Fatalf("a repeat of k's refusal through Acquire's context shrank the limit to %d", got)
	}
	lim := l.Limit()
	if got := refuse(WithKey(ctx, nil)); got != lim/2 {
		t.Fatalf("a refusal whose context names no key: %d, want %d halved", got, lim)
	}
}

// TestRefusingKeysAreBounded: a stream of ever-new refused keys keeps at most
// MaxRefusingKeys remembered, and each one's refusal is a first one.
func TestRefusingKeysAreBounded(t *testing.T) {
	l, tick := clocked(t, Config{Initial: 8, Max: 8, Min: 1, ProbeFirst: -1, ProbeInterval: -1})
	for i := range 3 * MaxRefusingKeys {
		tick(time.Millisecond)
		p := l.TryAcquire()
		p.DoneKey(Dropped, []byte(fmt.Sprintf("row-%d", i)))
		if n := len(l.refusing); n > MaxRefusingKeys {
			t.Fatalf("%d keys remembered, want ≤ %d", n, MaxRefusingKeys)
		}
	}
	if l.Limit() != 1 {
		t.Fatalf("limit %d after a stream of new keys refused, want Min (1)", l.Limit())
	}
}

// TestOneRefusingKeyBesideAConstantFarSide: 192 callers against a far side answering in 200 ms;
// caller 0's key is refused on every call (it retries at once, as a consumer retrying one
// key's message does). Its first refusal halves the limit (and ends the slow start: the limit
// then grows by one a window, as after any drop); its hundreds of repeats do not: the limit
// grows to 192 and stays there (the probes aside).
func TestOneRefusingKeyBesideAConstantFarSide(t *testing.T) {
	far := &oneKeyRefused{far: &constant{d: 200 * time.Millisecond, left: map[int]time.Duration{}}}
	r := simulateKeyed(t, Config{}, far, 192, 90*time.Second, 0, func(id int) []byte { return []byte(fmt.Sprint("row-", id)) })
	reached := -1
	for i, lim := range r.limits {
		if lim >= 192 {
			reached = i
			break
		}
	}
	if reached < 0 || reached > 60000 {
		t.Fatalf("the limit reached 192 at step %d (ms), want within 60 s; last %d", reached, r.lastLimit)
	}
	last := r.limits[60000:]
	steady := 0
	for _, lim := range last {
		if lim >= 150 {
			steady++
		}
	}
	if steady < len(last)*95/100 {
		t.Errorf("limit ≥ 150 for %d of the last %d ms; last %d", steady, len(last), r.lastLimit)
	}
	if far.refused < 100 {
		t.Errorf("the key was refused %d times, want it retried all along", far.refused)
	}
	t.Logf("192 reached after %d ms; %d calls done; the one key refused %d times; last limit %d", reached, r.done, far.refused, r.lastLimit)
}

// oneKeyRefused answers as far does, except that caller 0's calls are refused (Dropped).
type oneKeyRefused struct {
	far     farSide
	refused int
}

func (o *oneKeyRefused) start(id int) { o.far.start(id) }
func (o *oneKeyRefused) step(dt time.Duration) map[int]Outcome {
	out := o.far.step(dt)
	if _, ok := out[0]; ok {
		out[0] = Dropped
		o.refused++
	}
	return out
}

// TestKeyedDropsStillShrinkAnOverloadedFarSide: TestLimitShrinksOnDrops with each caller's
// calls naming the caller's own key (a refused caller retries the same key at once), alone and
// beside one key refused all along: the far side's overload still keeps the calls in flight
// near its 10.
func TestKeyedDropsStillShrinkAnOverloadedFarSide(t *testing.T) {
	for _, stuck := range []bool{false, true} {
		t.Run(fmt.Sprint("stuck=", stuck), func(t *testing.T) {
			drop := &dropping{cap: 10, d: 50 * time.Millisecond, left: map[int]time.Duration{}}
			var far farSide = drop
			if stuck {
				far = &oneKeyRefused{far: drop}
			}
			r := simulateKeyed(t, Config{}, far, 64, 60*time.Second, 0, func(id int) []byte { return []byte(fmt.Sprint("row-", id)) })
			above := 0
			for _, in := range r.inflight[5000:] {
				if in > 20 {
					above++
				}
			}
			if above > 0 {
				t.Errorf("more than 20 in flight for %d ms after the first 5 s", above)
			}
			if drop.drops*20 > drop.calls {
				t.Errorf("%d of %d calls dropped, want < 5%%", drop.drops, drop.calls)
			}
			// The limit is a sawtooth under a far side that drops past its capacity (it halves on
			// a drop and climbs back): its median over the last 30 s is its level, where the last
			// step alone may sit at a trough (CI: 3 at the last step).
			late := append([]int(nil), r.limits[len(r.limits)/2:]...)
			sort.Ints(late)
			if med := late[len(late)/2]; med < 4 {
				t.Errorf("limit's median over the last 30 s %d, want near the far side's 10", med)
			}
			t.Logf("%d calls, %d dropped, last limit %d, median of the last 30 s %d", drop.calls, drop.drops, r.lastLimit, late[len(late)/2])
		})
	}
}
