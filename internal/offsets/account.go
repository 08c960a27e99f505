package offsets

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/internal/parking"
)

// Segment kinds of an accounting report.
const (
	// SegProcessed: the consumer loop moved the watermark over these offsets, each one in
	// the transaction of its handler's effects or of its dead letter.
	SegProcessed = "processed"
	// SegOperatorSkip: skipped by a kafkatx command (audit kind operator_skip).
	SegOperatorSkip = offsetstore.KindOperatorSkip
	// SegUnexplainedSkip: Kafka was moved ahead with no kafkatx command on record and the
	// consumer followed it (audit kind unexplained_skip).
	SegUnexplainedSkip = offsetstore.KindUnexplainedSkip
	// SegGap: the watermark moved over these offsets outside kafkatx (audit kind
	// unexplained_move, written by the watermarks trigger): nothing says what became of them.
	SegGap = "gap"
)

// Segment is a half-open offset range [From, To) of one kind. EventID is the audit row that
// explains it (0 for processed ranges).
type Segment struct {
	From    int64  `json:"from_offset"`
	To      int64  `json:"to_offset"`
	Kind    string `json:"kind"`
	EventID int64  `json:"event_id,omitempty"`
}

// Len is the number of offsets in the segment.
func (s Segment) Len() int64 { return s.To - s.From }

// Account is the accounting report of one partition: [First, Watermark) split into
// processed, dead-lettered and skipped offsets, and anything that does not add up.
type Account struct {
	// Shard names the shard whose database holds the partition's watermark, when the command
	// reads a sharded group (kafkatx --shard); empty otherwise.
	Shard     string `json:"shard,omitempty"`
	Group     string `json:"group"`
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	// First is the first offset recorded for the partition (watermarks.first_offset) and
	// Watermark the next offset to process.
	First     int64 `json:"first_offset"`
	Watermark int64 `json:"watermark"`
	// Offsets counts [First, Watermark); it equals Processed + DeadLettered + Parked +
	// OperatorSkipped + UnexplainedSkipped + the gaps' lengths.
	Offsets      int64 `json:"offsets"`
	Processed    int64 `json:"processed"`
	DeadLettered int64 `json:"dead_lettered"`
	// Parked counts the offsets passed by the watermark whose message is parked (a parked
	// key's, table key_parking, kafkatx.Config.Park): read, neither applied nor dead-lettered
	// yet, waiting for their key. Counted apart from Processed.
	Parked             int64 `json:"parked"`
	OperatorSkipped    int64 `json:"operator_skipped"`
	UnexplainedSkipped int64 `json:"unexplained_skipped"`
	// Segments covers [First, Watermark) in order.
	Segments []Segment `json:"segments"`
	// UnexplainedSkips lists the ranges skipped by following an out-of-band Kafka move.
	UnexplainedSkips []Segment `json:"unexplained_skips"`
	// Adopted is the latest applied log_adopted row (the topic recreated or another cluster,
	// adopted by offsets reset --mode adopt or Config.OnLogChange), nil when none: the
	// partition's history starts there, at First, in the new log; what came before counted
	// offsets of the old log.
	Adopted *offsetstore.Event `json:"adopted,omitempty"`
	// RollbackReplays lists the ranges the database lost (a failover, a restore: audit kind
	// rollback_replayed) that the consumer processed again; they count as processed.
	RollbackReplays []Segment `json:"rollback_replays"`
	// Gaps lists every watermark move nothing explains: forward moves (offsets with no
	// record), rewinds without a replay (offsets processed again), deleted rows, and audit
	// rows that do not line up with the watermark's history. Empty when the partition is
	// accounted for.
	Gaps []Gap `json:"gaps"`
}

// Gap is one unexplained watermark move or inconsistency.
type Gap struct {
	From    int64  `json:"from_offset"`
	To      int64  `json:"to_offset"`
	What    string `json:"what"`
	EventID int64  `json:"event_id,omitempty"`
	Actor   string `json:"actor,omitempty"`
	At      string `json:"at,omitempty"`
}

// Accounted reports whether every offset in [First, Watermark) is processed, dead-lettered
// or skipped and the watermark's history has no unexplained move.
func (a Account) Accounted() bool { return len(a.Gaps) == 0 }

// Account builds the accounting report of each partition of topic the group has a
// watermark for (only partition p when p ≥ 0). It reads only the database, in one
// repeatable-read snapshot, and costs nothing on the consumer's hot path: the watermark
// moves only by the loop (processed or dead-lettered offsets) or with an audit row, and the
// watermarks trigger (migration 004) audits any other move as unexplained_move.
func (o *Operator) Account(ctx context.Context, group, topic string, p int32) ([]Account, error) {
	var out []Account
	err := pgx.BeginTxFunc(ctx, o.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		ws, err := o.store.Watermarks(ctx, tx, group, nil)
		if err != nil {
			return err
		}
		events, err := o.store.Events(ctx, tx, group, topic)
		if err != nil {
			return err
		}
		byTP := map[offsetstore.TP][]offsetstore.Event{}
		for _, e := range events {
			tp := offsetstore.TP{Topic: e.Topic, Partition: e.Partition}
			byTP[tp] = append(byTP[tp], e)
		}
		var tps []offsetstore.TP
		for tp := range ws {
			if (topic == "" || tp.Topic == topic) && (p < 0 || tp.Partition == p) {
				tps = append(tps, tp)
			}
		}
		sort.Slice(tps, func(i, j int) bool {
			if tps[i].Topic != tps[j].Topic {
				return tps[i].Topic < tps[j].Topic
			}
			return tps[i].Partition < tps[j].Partition
		})
		for _, tp := range tps {
			w := ws[tp]
			a := account(group, w, byTP[tp])
			if err := o.countDeadLetters(ctx, tx, &a); err != nil {
				return err
			}
			if err := o.countParked(ctx, tx, &a); err != nil {
				return err
			}
			out = append(out, a)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("offset accounting: %w", err)
	}
	return out, nil
}

// account replays the audit trail of one partition (oldest first) over [w.First, w.Next).
// Between two audited moves, the watermark can only have moved forward by the loop, so the
// range in between is processed.
func account(group string, w offsetstore.Watermark, events []offsetstore.Event) Account {
	a := Account{Group: group, Topic: w.Topic, Partition: w.Partition, First: w.First, Watermark: w.Next}
	// Only the current row's lifetime counts: a deleted row's history ends at its deletion.
	for i, e := range events {
		if e.Kind == offsetstore.KindWatermarkDeleted {
			a.Gaps = append(a.Gaps, gapOf(e, "watermark row deleted outside kafkatx (history before it is lost)"))
			events = events[i+1:]
			break
		}
	}
	// Only the current log counts: an adoption starts the history again in the new log.
	for i := len(events) - 1; i >= 0; i-- {
		if e := events[i]; e.Kind == offsetstore.KindLogAdopted && e.Status == StatusApplied {
			a.Adopted = &e
			events = events[i+1:]
			break
		}
	}
	var segs segments
	cur := w.First
	processedTo := func(at int64, e offsetstore.Event) {
		switch {
		case at > cur:
			segs.paint(Segment{From: cur, To: at, Kind: SegProcessed})
		case at < cur:
			a.Gaps = append(a.Gaps, Gap{From: at, To: cur, EventID: e.ID, Actor: e.Actor, At: e.At.UTC().Format("2006-01-02T15:04:05Z07:00"),
				What: fmt.Sprintf("audit row %d (%s) starts at %d but the watermark had reached %d: it moved back with no record", e.ID, e.Kind, at, cur)})
		}
	}
	for _, e := range events {
		switch {
		case (e.Kind == offsetstore.KindOperatorSkip && e.Status == StatusApplied) || e.Kind == offsetstore.KindUnexplainedSkip:
			processedTo(e.From, e)
			segs.paint(Segment{From: e.From, To: e.To, Kind: e.Kind, EventID: e.ID})
			cur = e.To
		case e.Kind == offsetstore.KindRollbackReplay:
			// The watermark did not move (the database had lost the range already): the loop
			// processes [From, To) again as any range.
			a.RollbackReplays = append(a.RollbackReplays, Segment{From: e.From, To: e.To, Kind: e.Kind, EventID: e.ID})
		case e.Kind == offsetstore.KindReplay && e.Status == StatusApplied:
			processedTo(e.To, e)
			cur = e.From // [From, To) runs again; later processing repaints it
		case e.Kind == offsetstore.KindUnexplainedMove && e.To > e.From:
			processedTo(e.From, e)
			segs.paint(Segment{From: e.From, To: e.To, Kind: SegGap, EventID: e.ID})
			a.Gaps = append(a.Gaps, gapOf(e, "watermark moved forward outside kafkatx: these offsets have no record"))
			cur = e.To
		case e.Kind == offsetstore.KindUnexplainedMove && e.To < e.From:
			processedTo(e.From, e)
			a.Gaps = append(a.Gaps, gapOf(e, "watermark moved back outside kafkatx: these offsets were processed again without a replay epoch"))
			cur = e.To
		}
	}
	if w.Next > cur {
		segs.paint(Segment{From: cur, To: w.Next, Kind: SegProcessed})
	} else if w.Next < cur {
		a.Gaps = append(a.Gaps, Gap{From: w.Next, To: cur,
			What: fmt.Sprintf("the watermark %d is below the last audited position %d: it moved back with no record", w.Next, cur)})
	}
	a.Segments = segs.clip(w.First, w.Next)
	a.Offsets = w.Next - w.First
	for _, s := range a.Segments {
		switch s.Kind {
		case SegGap:
			if s.EventID == 0 {
				a.Gaps = append(a.Gaps, Gap{From: s.From, To: s.To, What: "no record covers these offsets"})
			}
		case SegProcessed:
			a.Processed += s.Len()
		case SegOperatorSkip:
			a.OperatorSkipped += s.Len()
		case SegUnexplainedSkip:
			a.UnexplainedSkipped += s.Len()
			a.UnexplainedSkips = append(a.UnexplainedSkips, s)
		}
	}
	return a
}

// gapOf describes an audit row as a gap; its range is always written low to high.
func gapOf(e offsetstore.Event, what string) Gap {
	return Gap{From: min(e.From, e.To), To: max(e.From, e.To), What: what, EventID: e.ID, Actor: e.Actor, At: e.At.UTC().Format("2006-01-02T15:04:05Z07:00")}
}

// countDeadLetters moves the dead letters inside processed segments from Processed to
// DeadLettered.
func (o *Operator) countDeadLetters(ctx context.Context, tx pgx.Tx, a *Account) error {
	var since time.Time // dead letters of an adopted log's predecessor are not this log's
	if a.Adopted != nil {
		since = a.Adopted.At
	}
	rows, err := tx.Query(ctx, `SELECT "offset" FROM `+o.t.DeadLetters+`
		WHERE group_id = $1 AND topic = $2 AND partition = $3 AND "offset" >= $4 AND "offset" < $5 AND created_at >= $6 ORDER BY "offset"`,
		a.Group, a.Topic, a.Partition, a.First, a.Watermark, since)
	if err != nil {
		return fmt.Errorf("read dead letters of %s[%d]: %w", a.Topic, a.Partition, err)
	}
	offs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return fmt.Errorf("read dead letters of %s[%d]: %w", a.Topic, a.Partition, err)
	}
	i := 0
	for _, off := range offs {
		for i < len(a.Segments) && a.Segments[i].To <= off {
			i++
		}
		if i < len(a.Segments) && a.Segments[i].From <= off && a.Segments[i].Kind == SegProcessed {
			a.Processed--
			a.DeadLettered++
		}
	}
	return nil
}

// countParked moves the parked messages' offsets inside processed segments from Processed to
// Parked (a parked offset is accounted for: invariant 2).
func (o *Operator) countParked(ctx context.Context, tx pgx.Tx, a *Account) error {
	offs, err := parking.New(o.t.Schema).Offsets(ctx, tx, a.Group, a.Topic, a.Partition, a.First, a.Watermark)
	if err != nil {
		return err
	}
	i := 0
	for _, off := range offs {
		for i < len(a.Segments) && a.Segments[i].To <= off {
			i++
		}
		if i < len(a.Segments) && a.Segments[i].From <= off && a.Segments[i].Kind == SegProcessed {
			a.Processed--
			a.Parked++
		}
	}
	return nil
}

// segments is a sorted list of non-overlapping segments; a later paint wins.
type segments []Segment

func (ss *segments) paint(n Segment) {
	if n.To <= n.From {
		return
	}
	out := make(segments, 0, len(*ss)+2)
	for _, s := range *ss {
		if s.To <= n.From || s.From >= n.To {
			out = append(out, s)
			continue
		}
		if s.From < n.From {
			l := s
			l.To = n.From
			out = append(out, l)
		}
		if s.To > n.To {
			r := s
			r.From = n.To
			out = append(out, r)
		}
	}
	out = append(out, n)
	sort.Slice(out, func(i, j int) bool { return out[i].From < out[j].From })
	merged := out[:0]
	for _, s := range out {
		if k := len(merged) - 1; k >= 0 && merged[k].To == s.From && merged[k].Kind == s.Kind && merged[k].EventID == s.EventID {
			merged[k].To = s.To
			continue
		}
		merged = append(merged, s)
	}
	*ss = merged
}

// clip returns the segments inside [from, to), with any hole filled as a gap.
func (ss segments) clip(from, to int64) []Segment {
	var out []Segment
	cur := from
	for _, s := range ss {
		if s.To <= from || s.From >= to {
			continue
		}
		s.From, s.To = max(s.From, from), min(s.To, to)
		if s.From > cur {
			out = append(out, Segment{From: cur, To: s.From, Kind: SegGap})
		}
		out = append(out, s)
		cur = s.To
	}
	if cur < to {
		out = append(out, Segment{From: cur, To: to, Kind: SegGap})
	}
	return out
}
