package main

import (
	"net/url"
	"testing"
	"time"

	"github.com/kafkatx/kafkatx"
)

// An order event's key is its order id: the produce stamp is found by it, for stamped orders
// of this producer's run only.
func TestProducedAt(t *testing.T) {
	pr := &producer{run: "abc"}
	pr.next = 10 // ten unstamped orders (a backlog) came first
	pr.stampBase, pr.stamps = 11, []int64{1000, 2000, 3000}
	for _, c := range []struct {
		key  string
		want int64
		ok   bool
	}{
		{"GEN-abc-11", 1000, true},
		{"GEN-abc-13", 3000, true},
		{"GEN-abc-10", 0, false}, // the backlog's, not stamped
		{"GEN-abc-14", 0, false}, // not sent
		{"GEN-abd-12", 0, false}, // another run
		{"GEN-abc-x", 0, false},
		{"GEN-abc--1", 0, false},
		{"", 0, false},
	} {
		got, ok := pr.producedAt([]byte(c.key))
		if got != c.want || ok != c.ok {
			t.Errorf("producedAt(%q) = %d, %v; want %d, %v", c.key, got, ok, c.want, c.ok)
		}
	}
	// The keys orderValue writes are the ones producedAt parses.
	k, _ := orderValue("abc", 12)
	if got, ok := pr.producedAt(k); !ok || got != 2000 {
		t.Errorf("producedAt(orderValue's key %q) = %d, %v; want 2000, true", k, got, ok)
	}
}

func TestParseStat(t *testing.T) {
	// proc(5): pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
	// utime stime cutime cstime ...; comm may hold spaces and parentheses.
	line := "4242 (postgres: a (b) c) S 17 4242 4242 0 -1 4194560 100 0 0 0 250 50 1000 200 20 0 1 0 5 0 0"
	st, ok := parseStat(line)
	if !ok {
		t.Fatal("parseStat failed")
	}
	if st.ppid != 17 || st.self != 3*time.Second || st.children != 12*time.Second {
		t.Errorf("parseStat = %+v, want ppid 17, self 3s, children 12s", st)
	}
	if _, ok := parseStat("4242 (x) S 1 2"); ok {
		t.Error("parseStat accepted a short line")
	}
}

func TestParseCPULine(t *testing.T) {
	// user nice system idle iowait irq softirq steal guest guest_nice
	busy, total := parseCPULine("cpu  100 10 50 800 40 5 5 0 30 0")
	if busy != 170 || total != 1010 {
		t.Errorf("parseCPULine = %d busy, %d total; want 170, 1010 (guest is inside user)", busy, total)
	}
	if b, tot := parseCPULine("cpu0 1 2 3 4 5"); b != 0 || tot != 0 {
		t.Error("parseCPULine took a per-CPU line for the total")
	}
}

func TestDatabaseURL(t *testing.T) {
	got, err := databaseURL("postgres://u:p@127.0.0.1:5432/dev?sslmode=disable", "run_1", "kafkatx-bench/scale-1-0")
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(got)
	if err != nil {
		t.Fatal(err)
	}
	if u.Path != "/run_1" || u.Query().Get("sslmode") != "disable" || u.Query().Get("application_name") != "kafkatx-bench/scale-1-0" ||
		u.User.String() != "u:p" || u.Host != "127.0.0.1:5432" {
		t.Errorf("databaseURL = %s", got)
	}
	if _, err := databaseURL("host=/tmp dbname=x", "d", "a"); err == nil {
		t.Error("databaseURL accepted a keyword/value string")
	}
	if p := dbPort("postgres://u@h:24755/d"); p != "24755" {
		t.Errorf("dbPort = %q", p)
	}
}

// The soak's summary compares its first and last thirds, leaving out the last sample (a
// partial window); RSS growth is last over first.
func TestSummarize(t *testing.T) {
	var samples []soakSample
	for i := range 9 {
		samples = append(samples, soakSample{T: float64(70 + 10*i), RSSMB: 100 + float64(i), P99: 10, PubP99: 20, OutboxRows: int64(i * 10)})
	}
	samples = append(samples, soakSample{T: 155, RSSMB: 500, P99: 999, OutboxRows: 5}) // the partial last window
	s := summarize(samples)
	if s.RSSMedFirst != 101 || s.RSSMedLast != 107 {
		t.Errorf("RSS thirds = %v/%v, want 101/107 (medians of 100-102 and 106-108)", s.RSSMedFirst, s.RSSMedLast)
	}
	if s.RSSGrowth != round3(107.0/101) {
		t.Errorf("RSS growth = %v", s.RSSGrowth)
	}
	if s.P99MedLast != 10 || s.PubP99MedFirst != 20 {
		t.Errorf("p99 thirds = %+v", s)
	}
	if s.BacklogMedFirst != 10 || s.BacklogMedLast != 70 || s.BacklogMax != 80 {
		t.Errorf("backlog = %v/%v max %d, want 10/70 max 80", s.BacklogMedFirst, s.BacklogMedLast, s.BacklogMax)
	}
	if got := summarize(nil); got != (soakSummary{}) {
		t.Errorf("summarize(nil) = %+v", got)
	}
	one := summarize([]soakSample{{RSSMB: 50}})
	if one.RSSMedFirst != 50 || one.RSSMedLast != 50 {
		t.Errorf("one sample: %+v", one)
	}

	// A long soak leaves its first minute (the heap growing to its working size) out; a
	// short one, with fewer than three full samples after it, keeps it.
	var long []soakSample
	for i := range 12 { // t = 10 .. 120 s
		rss := 150.0
		if i < 6 {
			rss = 50 // warm-up
		}
		long = append(long, soakSample{T: float64(10 * (i + 1)), RSSMB: rss})
	}
	long = append(long, soakSample{T: 125, RSSMB: 150})
	if got := summarize(long); got.RSSMedFirst != 150 || got.RSSGrowth != 1 {
		t.Errorf("warm-up not left out: first third %v, growth %v", got.RSSMedFirst, got.RSSGrowth)
	}
	short := []soakSample{{T: 10, RSSMB: 50}, {T: 20, RSSMB: 60}, {T: 30, RSSMB: 70}, {T: 31, RSSMB: 70}}
	if got := summarize(short); got.RSSMedFirst != 50 || got.RSSMedLast != 70 {
		t.Errorf("short soak: %+v", got)
	}
}

// A window hands out what was added since the last take, sorted, and forgets it; so does the
// commit probe's take, which bounds the soak's memory by one window.
func TestWindowTake(t *testing.T) {
	var w window
	w.add(3 * time.Millisecond)
	w.add(1 * time.Millisecond)
	if got := w.take(); len(got) != 2 || got[0] != time.Millisecond {
		t.Errorf("take = %v", got)
	}
	if got := w.take(); len(got) != 0 {
		t.Errorf("second take = %v, want nothing", got)
	}

	p := newCommitProbe()
	for _, ago := range []time.Duration{30 * time.Millisecond, 10 * time.Millisecond} {
		statement(p, nil, "begin", "BEGIN", nil)
		p.holding(nil, []*kafkatx.Message{stamped(ago)})
		statement(p, nil, "commit", "COMMIT", nil)
	}
	got := p.take()
	if len(got) != 2 || got[0] > got[1] {
		t.Fatalf("probe take = %v, want two sorted", got)
	}
	if len(p.take()) != 0 || len(p.latencies()) != 0 {
		t.Error("probe kept latencies after take")
	}
	if p.committed.Load() != 2 {
		t.Errorf("committed = %d, want 2 (take forgets latencies, not counts)", p.committed.Load())
	}
}
