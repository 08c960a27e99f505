package walrelay

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
)

// timelines is the server's timeline history as a relay reads it at the start of a stream
// (IDENTIFY_SYSTEM, then TIMELINE_HISTORY of the current timeline): the timeline the server
// writes on now and where each of its ancestors ended. A promoted standby keeps the primary's
// system identifier and starts a new timeline at the end of the WAL it had replayed; WAL
// below that switch point is the ancestors' and shared, above it an LSN names different WAL
// on each timeline. So an LSN alone never says what a checkpoint covers: only a timeline and
// an LSN do (docs/outbox-wal.md, Failover).
type timelines struct {
	current uint32
	ends    []timelineEnd // the ancestors, oldest first
}

// timelineEnd is an ancestor timeline and the LSN where the next one branched off it: WAL
// before end is the ancestor's, in every later timeline too.
type timelineEnd struct {
	tli uint32
	end pglogrepl.LSN
}

// readTimelines reads conn's server's timeline history (conn is a replication connection;
// current is IDENTIFY_SYSTEM's timeline). Timeline 1 has no history file.
func readTimelines(ctx context.Context, conn *pgconn.PgConn, current int32) (timelines, error) {
	if current <= 1 {
		return timelines{current: 1}, nil
	}
	h, err := pglogrepl.TimelineHistory(ctx, conn, current)
	if err != nil {
		return timelines{}, fmt.Errorf("walrelay: TIMELINE_HISTORY %d: %w", current, err)
	}
	return parseTimelines(uint32(current), h.Content)
}

// parseTimelines parses a timeline history file (PostgreSQL's NNNNNNNN.history: one line per
// ancestor, "<timeline>\t<switch point X/X>\t<reason>", comments after '#').
func parseTimelines(current uint32, content []byte) (timelines, error) {
	t := timelines{current: current}
	sc := bufio.NewScanner(bytes.NewReader(content))
	for sc.Scan() {
		line := sc.Text()
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) < 2 {
			return timelines{}, fmt.Errorf("walrelay: timeline history of %d: malformed line %q", current, sc.Text())
		}
		tli, err := strconv.ParseUint(f[0], 10, 32)
		if err != nil {
			return timelines{}, fmt.Errorf("walrelay: timeline history of %d: line %q: %w", current, sc.Text(), err)
		}
		end, err := pglogrepl.ParseLSN(f[1])
		if err != nil {
			return timelines{}, fmt.Errorf("walrelay: timeline history of %d: line %q: %w", current, sc.Text(), err)
		}
		if n := len(t.ends); n > 0 && (uint32(tli) <= t.ends[n-1].tli || end < t.ends[n-1].end) {
			return timelines{}, fmt.Errorf("walrelay: timeline history of %d: line %q out of order", current, sc.Text())
		}
		t.ends = append(t.ends, timelineEnd{tli: uint32(tli), end: end})
	}
	return t, sc.Err()
}

// of returns the timeline a commit at LSN l was written on: the oldest ancestor that had
// not ended at l, else the current one.
func (t timelines) of(l pglogrepl.LSN) uint32 {
	for _, e := range t.ends {
		if l < e.end {
			return e.tli
		}
	}
	return t.current
}

// ended returns where ancestor tli ended; false when tli is the current timeline or not in
// this server's history.
func (t timelines) ended(tli uint32) (pglogrepl.LSN, bool) {
	for _, e := range t.ends {
		if e.tli == tli {
			return e.end, true
		}
	}
	return 0, false
}

// coverage is what a checkpoint covers on this server's history.
type coverage struct {
	// through: a transaction whose commit LSN is at or below it was published already.
	through pglogrepl.LSN
	// lostFrom > 0: the checkpoint's timeline ended at lostFrom (a failover), below the
	// checkpoint's LSN: the transactions it published in [lostFrom, checkpoint] are not in
	// this database (ghost events, until their input is processed again).
	lostFrom pglogrepl.LSN
}

// covered returns what ck covers here. A checkpoint of the current timeline covers through its
// LSN; one of an ancestor covers through its LSN or the ancestor's end, whichever is lower,
// since what follows the end on the current timeline is other WAL. A checkpoint without a
// timeline (written before kafkatx recorded it) is taken as of the timeline its LSN falls in.
// A checkpoint of a timeline this server never had (a database restored from a backup older
// than the timeline, another cluster's fork) is a FatalError: what it covers cannot be known.
func (t timelines) covered(ck checkpoint) (coverage, error) {
	tli := ck.Timeline
	if tli == 0 || ck.LSN == 0 {
		tli = t.of(ck.LSN)
	}
	if tli == t.current {
		return coverage{through: ck.LSN}, nil
	}
	end, ok := t.ended(tli)
	if !ok {
		return coverage{}, &FatalError{fmt.Errorf("walrelay: the checkpoint (commit LSN %s on timeline %d, written %s) is of a timeline this server's history (timeline %d: %s) does not hold: "+
			"what it covers here cannot be known, and the relay publishes nothing rather than guess. If this database was restored from an older backup, "+
			"republish what it holds past the backup, then write a tombstone for the slot's key (<system id>/<database>/<slot>) on the checkpoint topic so the relay starts over",
			ck.LSN, tli, ck.At.Format("2006-01-02T15:04:05Z07:00"), t.current, t.describe())}
	}
	if ck.LSN < end {
		return coverage{through: ck.LSN}, nil
	}
	return coverage{through: end - 1, lostFrom: end}, nil
}

// describe renders the history: "1 until 0/3018538, 2 until 0/5000000, 3 (current)".
func (t timelines) describe() string {
	var b strings.Builder
	for _, e := range t.ends {
		fmt.Fprintf(&b, "%d until %s, ", e.tli, e.end)
	}
	fmt.Fprintf(&b, "%d (current)", t.current)
	return b.String()
}

// timelineSource mixes timeline tli into a source hash: the identity of the outbox id's
// source bits. Timeline 1 leaves src as it is (the ids kafkatx always gave); each later
// timeline maps the same source to other bits (multiplication by an odd constant is a
// bijection modulo 2^26), so two timelines' records never share an id even at the same
// commit LSN and position.
func timelineSource(src, tli uint32) uint32 {
	return (src ^ (tli-1)*0x2545F49) & (1<<26 - 1)
}
