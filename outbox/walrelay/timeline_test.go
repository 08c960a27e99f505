package walrelay

import (
	"errors"
	"testing"

	"github.com/jackc/pglogrepl"
)

func lsn(t *testing.T, s string) pglogrepl.LSN {
	t.Helper()
	l, err := pglogrepl.ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// The case of the report: a checkpoint written on timeline 1 at 0/43D0F08, a standby promoted
// at 0/34AD000 (timeline 2) whose WAL is at 0/34AD248. Comparing LSNs alone skipped every new
// transaction; on the history the checkpoint covers only what precedes timeline 1's end, and
// what it published past the end is reported lost (ghosts).
func TestCheckpointOfAnOlderTimelineCoversOnlyTheSharedHistory(t *testing.T) {
	tl, err := parseTimelines(3, []byte("1\t0/34AD000\tno recovery target specified\n\n# comment\n2\t0/5000000\tno recovery target specified\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := tl.describe(); got != "1 until 0/34AD000, 2 until 0/5000000, 3 (current)" {
		t.Fatalf("describe %q", got)
	}
	for _, c := range []struct {
		at   string
		want uint32
	}{{"0/1000000", 1}, {"0/34ACFFF", 1}, {"0/34AD000", 2}, {"0/34AD248", 2}, {"0/4FFFFFF", 2}, {"0/5000000", 3}, {"1/0", 3}} {
		if got := tl.of(lsn(t, c.at)); got != c.want {
			t.Fatalf("timeline of %s: %d, want %d", c.at, got, c.want)
		}
	}
	for _, c := range []struct {
		name               string
		ck                 checkpoint
		through, lostFrom  string
		newCommitPublished string // a commit of the current history that must not be skipped
	}{
		{"ahead of its timeline's end", checkpoint{LSN: lsn(t, "0/43D0F08"), Timeline: 1}, "0/34ACFFF", "0/34AD000", "0/34AD248"},
		{"inside the shared history", checkpoint{LSN: lsn(t, "0/2000000"), Timeline: 1}, "0/2000000", "0/0", "0/2000001"},
		{"timeline 2 past its end", checkpoint{LSN: lsn(t, "0/6000000"), Timeline: 2}, "0/4FFFFFF", "0/5000000", "0/5000100"},
		{"current timeline", checkpoint{LSN: lsn(t, "0/6000000"), Timeline: 3}, "0/6000000", "0/0", "0/6000001"},
		{"no timeline recorded (older kafkatx)", checkpoint{LSN: lsn(t, "0/2000000")}, "0/2000000", "0/0", "0/2000001"},
		{"none", checkpoint{}, "0/0", "0/0", "0/1"},
	} {
		cov, err := tl.covered(c.ck)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if cov.through != lsn(t, c.through) || cov.lostFrom != lsn(t, c.lostFrom) {
			t.Fatalf("%s: covers through %s, lost from %s; want %s, %s", c.name, cov.through, cov.lostFrom, c.through, c.lostFrom)
		}
		if lsn(t, c.newCommitPublished) <= cov.through {
			t.Fatalf("%s: a commit at %s would be skipped", c.name, c.newCommitPublished)
		}
	}
	var fe *FatalError
	if _, err := tl.covered(checkpoint{LSN: lsn(t, "0/6000000"), Timeline: 4}); !errors.As(err, &fe) {
		t.Fatalf("a checkpoint of a timeline the server never had: %v, want a FatalError", err)
	}
	if one, err := parseTimelines(1, nil); err != nil || one.of(lsn(t, "5/0")) != 1 {
		t.Fatalf("timeline 1: %+v %v", one, err)
	}
	if _, err := parseTimelines(3, []byte("2\t0/5000000\tx\n1\t0/34AD000\tx\n")); err == nil {
		t.Fatal("a history out of order parsed")
	}
}

// Timeline 1 keeps the ids kafkatx always gave; two timelines never share an id for the
// same commit LSN and position (the old primary's ghosts and the new primary's records).
func TestOutboxIDsDifferAcrossTimelines(t *testing.T) {
	src := sourceHash("7312345678901234567", "orders", "kafkatx")
	if timelineSource(src, 1) != src {
		t.Fatal("timeline 1 changed the source bits")
	}
	seen := map[uint32]uint32{}
	for tli := uint32(1); tli <= 5000; tli++ {
		b := timelineSource(src, tli)
		if b >= 1<<26 {
			t.Fatalf("timeline %d: source bits %#x past 26 bits", tli, b)
		}
		if o, ok := seen[b]; ok {
			t.Fatalf("timelines %d and %d share source bits %#x", o, tli, b)
		}
		seen[b] = tli
	}
	if outboxID(timelineSource(src, 1), 0x43D0F08, 0) == outboxID(timelineSource(src, 2), 0x43D0F08, 0) {
		t.Fatal("two timelines' records at the same commit LSN share an id")
	}
}
