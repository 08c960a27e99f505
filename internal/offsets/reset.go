package offsets

import (
	"context"
	"errors"
	"fmt"
	"github.com/kafkatx/kafkatx/internal/msgfmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/offsetstate"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/internal/parking"
	"github.com/kafkatx/kafkatx/internal/pgerr"
)

// Mode says which way a reset moves the watermark.
type Mode string

const (
	// ModeSkip moves both sides forward; [watermark, target) is recorded as operator_skip
	// and never processed.
	ModeSkip Mode = "skip"
	// ModeReplay moves both sides back; [target, watermark) runs again under a new replay
	// epoch (watermarks.replay_epoch + 1), so business idempotency keys scoped by epoch do
	// not swallow the replay.
	ModeReplay Mode = "replay"
	// ModeAdopt moves the watermark onto a new log — the topic deleted and created again
	// under the same name, or another cluster (offsetstate.LogChanged) — at the target,
	// whichever way that is: the old log's offsets mean nothing there. The partition's history
	// starts again at the target, the new topic and cluster ids are recorded, and the audit
	// row (kind log_adopted, [old watermark, target)) names both ids. Refused when the log has
	// not changed.
	ModeAdopt Mode = "adopt"
)

// TargetKind says how a reset's target offset is found.
type TargetKind int

const (
	// TargetOffset is an explicit offset (Target.Offset).
	TargetOffset TargetKind = iota
	// TargetTime is the earliest offset whose record timestamp is at or after Target.Time
	// (the log end offset when every record is older).
	TargetTime
	// TargetEarliest is the log start offset.
	TargetEarliest
	// TargetLatest is the log end offset.
	TargetLatest
	// TargetDatabase aligns Kafka's committed offset to the watermark; the watermark does
	// not move and Mode is ignored.
	TargetDatabase
)

// Target is where a reset moves a partition.
type Target struct {
	Kind   TargetKind
	Offset int64
	Time   time.Time
}

func (t Target) String() string {
	switch t.Kind {
	case TargetTime:
		return "the first offset at or after " + t.Time.UTC().Format(time.RFC3339Nano)
	case TargetEarliest:
		return "the log start"
	case TargetLatest:
		return "the log end"
	case TargetDatabase:
		return "the database watermark"
	}
	return "offset " + strconv.FormatInt(t.Offset, 10)
}

// TargetFrom is the Target the operator asked for, by the first of: an explicit offset
// (toOffset non-nil), a time (toTime, RFC 3339), the log start (earliest), the log end
// (latest); none of them means TargetDatabase. The CLI's flags and the console's fields both
// come through it. The error is a toTime that does not parse.
func TargetFrom(toOffset *int64, toTime string, earliest, latest bool) (Target, error) {
	switch {
	case toOffset != nil:
		return Target{Kind: TargetOffset, Offset: *toOffset}, nil
	case toTime != "":
		t, err := time.Parse(time.RFC3339Nano, toTime)
		if err != nil {
			return Target{}, fmt.Errorf("want RFC 3339, such as 2025-01-31T12:00:00Z: %w", err)
		}
		return Target{Kind: TargetTime, Time: t}, nil
	case earliest:
		return Target{Kind: TargetEarliest}, nil
	case latest:
		return Target{Kind: TargetLatest}, nil
	}
	return Target{Kind: TargetDatabase}, nil
}

// ResetRequest is one `kafkatx offsets reset` command.
type ResetRequest struct {
	Group string
	Topic string
	// Partition limits the reset to one partition; -1 means every partition of Topic.
	Partition int32
	Target    Target
	Mode      Mode // ignored for TargetDatabase
	// Reason is why (required); Actor is who (Actor() when empty).
	Reason string
	Actor  string
}

// Step actions, named as the audit kinds they write; ActionNone changes nothing.
const (
	ActionSkip   = offsetstore.KindOperatorSkip
	ActionReplay = offsetstore.KindReplay
	ActionAlign  = offsetstore.KindAlign
	ActionAdopt  = offsetstore.KindLogAdopted
	ActionNone   = "none"
)

// Step is one partition's part of a plan.
type Step struct {
	offsetstore.TP
	// Watermark is the database's next offset to process when the plan was made.
	Watermark int64
	// Committed is Kafka's committed offset when the plan was made (nil: none).
	Committed *int64
	LogStart  int64
	LogEnd    int64
	// Target is where both sides go (for align: where Kafka goes, the watermark).
	Target int64
	// Action is ActionSkip, ActionReplay, ActionAlign or ActionNone.
	Action string
	// Note explains ActionNone, or adds a remark.
	Note string
	// AuditID is the audit row Execute wrote for the step (0 before Execute).
	AuditID int64
	// Done says how Execute finished the step: "applied", or "applied by the consumer"
	// when a consumer followed the skip first.
	Done string
	// Log compares the log the watermark was recorded in with the current one (ActionAdopt
	// records Log.Current).
	Log offsetstate.LogChange
	// ParkedReplayed is, for ActionReplay, how many parked messages (kafkatx.Config.Park) lie
	// at or above the target: the replay reads them again from Kafka and Execute deletes their
	// rows, so that they do not run twice.
	ParkedReplayed int
}

// Messages is how many offsets the step skips or replays.
func (s Step) Messages() int64 {
	if s.Target > s.Watermark {
		return s.Target - s.Watermark
	}
	return s.Watermark - s.Target
}

// Range is the half-open offset range the step's audit row records.
func (s Step) Range() (from, to int64) {
	switch s.Action {
	case ActionSkip:
		return s.Watermark, s.Target
	case ActionReplay:
		return s.Target, s.Watermark
	case ActionAdopt:
		return s.Watermark, s.Target // two logs: the old watermark, the new log's start
	case ActionAlign:
		if s.Committed != nil {
			return *s.Committed, s.Watermark
		}
		return s.Watermark, s.Watermark
	}
	return s.Watermark, s.Watermark
}

// Plan is a reset worked out against the current state, before anything changes.
type Plan struct {
	Request ResetRequest
	// Group is the broker's view of the group; a plan with active members cannot execute.
	Group Group
	Steps []Step
}

// Changes reports whether any step does something.
func (p *Plan) Changes() bool {
	for _, s := range p.Steps {
		if s.Action != ActionNone {
			return true
		}
	}
	return false
}

// ActiveGroupError is returned by Execute (and reported by a dry run) while the consumer
// group has members: moving offsets under a running consumer would race its commits.
type ActiveGroupError struct {
	Group   string
	State   string
	Members []string
}

func (e *ActiveGroupError) Error() string {
	return fmt.Sprintf("group %q is %s with %d active member(s): %s; stop every consumer of the group first "+
		"(a static member, with group.instance.id, stays until its session times out)",
		e.Group, msgfmt.Text(e.State), len(e.Members), msgfmt.Text(strings.Join(e.Members, ", ")))
}

// PlanReset works out what req would do to each partition. It changes nothing. It fails on
// a request that cannot be carried out: no reason, a target outside the log, a skip that
// would move back or a replay that would move forward, a named partition without a
// watermark.
func (o *Operator) PlanReset(ctx context.Context, req ResetRequest) (*Plan, error) {
	if req.Group == "" || req.Topic == "" {
		return nil, errors.New("reset: group and topic are required")
	}
	if strings.TrimSpace(req.Reason) == "" {
		return nil, errors.New("reset: a reason is required (it goes in the audit trail)")
	}
	if req.Target.Kind != TargetDatabase && req.Mode != ModeSkip && req.Mode != ModeReplay && req.Mode != ModeAdopt {
		return nil, fmt.Errorf("reset: mode %q: want skip, replay or adopt", req.Mode)
	}
	if req.Actor == "" {
		req.Actor = Actor()
	}
	tps, err := o.topicPartitions(ctx, req.Topic, req.Partition)
	if err != nil {
		return nil, err
	}
	ws, err := o.store.Watermarks(ctx, o.pool, req.Group, tps)
	if err != nil {
		return nil, err
	}
	committed, err := o.kafka.Committed(ctx, req.Group, tps)
	if err != nil {
		return nil, err
	}
	logs, err := o.kafka.LogOffsets(ctx, tps)
	if err != nil {
		return nil, err
	}
	var atTime map[offsetstore.TP]int64
	if req.Target.Kind == TargetTime {
		if atTime, err = o.kafka.OffsetsForTime(ctx, tps, req.Target.Time); err != nil {
			return nil, err
		}
	}
	ids, err := o.kafka.LogIDs(ctx, []string{req.Topic})
	if err != nil {
		return nil, err
	}
	g, err := o.kafka.DescribeGroup(ctx, req.Group)
	if err != nil {
		return nil, err
	}
	p := &Plan{Request: req, Group: g}
	for _, tp := range tps {
		w, hasW := ws[tp]
		s := Step{TP: tp, LogStart: logs[tp].Start, LogEnd: logs[tp].End, Action: ActionNone}
		if k, ok := committed[tp]; ok {
			s.Committed = ptr(k)
		}
		if !hasW {
			if req.Partition >= 0 {
				return nil, fmt.Errorf("reset: %s has no watermark for group %q: kafkatx has not processed it; "+
					"its first run starts at Kafka's committed offset, so move that with Kafka's own tools", tp, req.Group)
			}
			s.Note = "no watermark: kafkatx has not processed this partition for the group"
			p.Steps = append(p.Steps, s)
			continue
		}
		s.Watermark = w.Next
		s.Log = offsetstate.CompareLog(offsetstate.LogID{Cluster: w.ClusterID, Topic: w.TopicID}, ids[tp.Topic])
		switch req.Target.Kind {
		case TargetOffset:
			s.Target = req.Target.Offset
		case TargetTime:
			s.Target = atTime[tp]
		case TargetEarliest:
			s.Target = s.LogStart
		case TargetLatest:
			s.Target = s.LogEnd
		case TargetDatabase:
			s.Target = w.Next
		}
		if s.Target < s.LogStart || s.Target > s.LogEnd {
			if req.Target.Kind != TargetDatabase {
				return nil, fmt.Errorf("reset: %s: target %d is outside the log [%d, %d]", tp, s.Target, s.LogStart, s.LogEnd)
			}
			s.Note = fmt.Sprintf("the watermark %d is outside the log [%d, %d]", w.Next, s.LogStart, s.LogEnd)
		}
		if err := adoptFits(req, s); err != nil {
			return nil, err
		}
		switch {
		case req.Mode == ModeAdopt:
			s.Action = ActionAdopt
		case req.Target.Kind == TargetDatabase:
			if s.Committed != nil && *s.Committed == w.Next {
				s.Note = "already aligned"
			} else {
				s.Action = ActionAlign
			}
		case s.Target == w.Next:
			s.Note = "the watermark is already at the target"
			if s.Committed == nil || *s.Committed != w.Next {
				s.Note += "; Kafka is not: align it with --to-database"
			}
		case req.Mode == ModeSkip && s.Target < w.Next:
			return nil, fmt.Errorf("reset: %s: target %d is below the watermark %d: --mode skip moves forward; use --mode replay to run offsets again", tp, s.Target, w.Next)
		case req.Mode == ModeReplay && s.Target > w.Next:
			return nil, fmt.Errorf("reset: %s: target %d is above the watermark %d: --mode replay moves back; use --mode skip to skip offsets", tp, s.Target, w.Next)
		case req.Mode == ModeSkip:
			s.Action = ActionSkip
		default:
			s.Action = ActionReplay
			// The parked messages the replay reads again, whose rows it deletes (Execute).
			offs, err := parking.New(o.t.Schema).Offsets(ctx, o.pool, req.Group, tp.Topic, tp.Partition, s.Target, -1)
			if err != nil && !pgerr.IsCode(err, "42P01") { // a schema before migration 013 has none
				return nil, err
			}
			s.ParkedReplayed = len(offs)
		}
		p.Steps = append(p.Steps, s)
	}
	return p, nil
}

// adoptFits refuses an adoption of a log that has not changed, and any other reset of one
// that has: its watermark counts offsets of the old log, so a skip, replay or align from it
// would mix the two logs' offsets.
func adoptFits(req ResetRequest, s Step) error {
	changed := s.Log.Changed()
	switch {
	case req.Mode == ModeAdopt && req.Target.Kind == TargetDatabase:
		return errors.New("reset: --mode adopt needs a place in the new log: --to-earliest, --to-latest, --to-time or --to-offset")
	case req.Mode == ModeAdopt && !changed:
		return fmt.Errorf("reset: %s: the log has not changed (topic id %s, cluster id %s, as recorded with the watermark): "+
			"--mode adopt is for a topic deleted and created again, or another cluster; use --mode skip or replay",
			s.TP, orUnknown(s.Log.Current.Topic), orUnknown(s.Log.Current.Cluster))
	case req.Mode != ModeAdopt && changed:
		return fmt.Errorf("reset: %s: the log behind the watermark changed (%s); the watermark %d counts offsets of the old log: "+
			"adopt the new log with --mode adopt --to-earliest (or --to-latest, --to-time)", s.TP, s.Log.What(), s.Watermark)
	}
	return nil
}

func orUnknown(id string) string {
	if id == "" {
		return "unknown"
	}
	return id
}

// afterKafkaCommit runs in tests between moving Kafka's offsets and the database
// transaction, to stop Execute where a crash would.
var afterKafkaCommit func() error

// ExecuteReset carries out a plan, both sides in lockstep, and fills in each step's AuditID
// and Done. It refuses with *ActiveGroupError while the group has members. Order, so that a
// crash at any point leaves a state the consumer handles correctly:
//  1. one transaction writes an audit row per step with status 'pending';
//  2. Kafka's committed offsets move (AlterConsumerGroupOffsets, all steps at once);
//  3. per step, one transaction moves the watermark with compare-and-set, bumps the replay
//     epoch for a replay, and marks the audit row applied.
//
// A crash after 2 leaves Kafka ahead for a skip, which the consumer follows as the pending
// operator skip (not an unexplained one), or behind for a replay, which the consumer undoes
// by re-committing the watermark (run the replay again). A crash before 2 leaves a pending
// row that the next reset of the partition abandons.
func (o *Operator) ExecuteReset(ctx context.Context, p *Plan) error {
	req := p.Request
	g, err := o.kafka.DescribeGroup(ctx, req.Group)
	if err != nil {
		return err
	}
	p.Group = g
	if len(g.Members) > 0 {
		return &ActiveGroupError{Group: req.Group, State: g.State, Members: g.Members}
	}
	var steps []*Step
	for i := range p.Steps {
		if p.Steps[i].Action != ActionNone {
			steps = append(steps, &p.Steps[i])
		}
	}
	if len(steps) == 0 {
		return nil
	}
	// 1. Intent.
	err = pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
		for _, s := range steps {
			if err := o.recordIntent(ctx, tx, req, s); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("reset: record intent: %w", err)
	}
	// 2. Kafka.
	targets := map[offsetstore.TP]int64{}
	for _, s := range steps {
		targets[s.TP] = s.Target
	}
	if err := o.kafka.Commit(ctx, req.Group, targets); err != nil {
		o.abandon(context.WithoutCancel(ctx), steps)
		return fmt.Errorf("reset: %w (nothing changed; the audit rows are marked abandoned)", err)
	}
	if afterKafkaCommit != nil {
		if err := afterKafkaCommit(); err != nil {
			return err
		}
	}
	// 3. Database.
	for _, s := range steps {
		if err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error { return o.applyStep(ctx, tx, req.Group, s) }); err != nil {
			// The database refused the watermark's move while the process runs: the command
			// will not complete this step, so its row is abandoned (not left pending for the
			// consumer to finish as if the command had died), and offsets status describes the
			// half-applied reset as such (Hints).
			o.abandon(context.WithoutCancel(ctx), []*Step{s})
			return fmt.Errorf("reset: %s: Kafka's committed offset is at %d but the watermark update was refused: %w "+
				"(audit row %d marked abandoned; run the same reset again to finish it, or reset --to-database to put Kafka back)", s.TP, s.Target, err, s.AuditID)
		}
	}
	return nil
}

// recordIntent writes the step's audit row as pending, reusing a pending row of exactly the
// same action and range (a command that stopped half way and is run again) and abandoning
// any other pending row of the partition, which can no longer apply.
func (o *Operator) recordIntent(ctx context.Context, tx pgx.Tx, req ResetRequest, s *Step) error {
	from, to := s.Range()
	var reuse int64
	err := tx.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM `+o.t.OffsetAudit+`
		WHERE group_id = $1 AND topic = $2 AND partition = $3 AND status = 'pending' AND kind = $4 AND from_offset = $5 AND to_offset = $6`,
		req.Group, s.Topic, s.Partition, s.Action, from, to).Scan(&reuse)
	if err != nil {
		return fmt.Errorf("find pending audit row of %s: %w", s.TP, err)
	}
	if _, err := tx.Exec(ctx, `UPDATE `+o.t.OffsetAudit+` SET status = 'abandoned'
		WHERE group_id = $1 AND topic = $2 AND partition = $3 AND status = 'pending' AND id <> $4`,
		req.Group, s.Topic, s.Partition, reuse); err != nil {
		return fmt.Errorf("abandon stale pending audit rows of %s: %w", s.TP, err)
	}
	if reuse != 0 {
		s.AuditID = reuse
		return nil
	}
	reason := req.Reason
	if s.Action == ActionAdopt {
		reason += "; log changed: " + s.Log.What()
	}
	s.AuditID, err = o.store.InsertEvent(ctx, tx, offsetstore.Event{Group: req.Group, Topic: s.Topic, Partition: s.Partition,
		Kind: s.Action, From: from, To: to, Reason: reason, Actor: req.Actor, Status: StatusPending})
	return err
}

// applyStep moves the watermark of one step (compare-and-set on the planned watermark) and
// marks its audit row applied, in tx. The transaction-local setting kafkatx.audit_id tells
// the watermarks trigger (migration 004) that an audited command made the move.
func (o *Operator) applyStep(ctx context.Context, tx pgx.Tx, group string, s *Step) error {
	if _, err := tx.Exec(ctx, `SELECT set_config('kafkatx.audit_id', $1, true)`, strconv.FormatInt(s.AuditID, 10)); err != nil {
		return fmt.Errorf("mark transaction as audited: %w", err)
	}
	var next int64
	err := tx.QueryRow(ctx, `SELECT next_offset FROM `+o.t.Watermarks+` WHERE group_id = $1 AND topic = $2 AND partition = $3 FOR UPDATE`,
		group, s.Topic, s.Partition).Scan(&next)
	if err != nil {
		return fmt.Errorf("read watermark: %w", err)
	}
	var status string
	if err := tx.QueryRow(ctx, `SELECT status FROM `+o.t.OffsetAudit+` WHERE id = $1`, s.AuditID).Scan(&status); err != nil {
		return fmt.Errorf("read audit row %d: %w", s.AuditID, err)
	}
	switch s.Action {
	case ActionAlign:
		if next != s.Watermark {
			return fmt.Errorf("the watermark moved from %d to %d while Kafka was aligned to %d: run the command again", s.Watermark, next, s.Watermark)
		}
	case ActionSkip:
		if next == s.Target && status == StatusApplied {
			s.Done = "applied by the consumer" // it started in between and followed the pending skip
			return nil
		}
		if next != s.Watermark {
			return fmt.Errorf("the watermark moved from %d to %d since the plan (a consumer ran?); Kafka is at %d now: "+
				"check `kafkatx offsets status` and run the command again", s.Watermark, next, s.Target)
		}
		if err := o.store.Advance(ctx, tx, group, s.TP, "", s.Watermark, s.Target, -1); err != nil {
			return err
		}
		if err := o.store.DeleteAttempts(ctx, tx, group, s.TP, s.Watermark, s.Target); err != nil {
			return err
		}
		// Offsets a consumer with Config.Concurrency > 1 applied above the old watermark: those
		// below the target are skipped anyway; those above stay done.
		if err := o.store.DeleteDone(ctx, tx, group, s.TP, s.Target); err != nil {
			return err
		}
	case ActionAdopt:
		if next != s.Watermark {
			return fmt.Errorf("the watermark moved from %d to %d since the plan (a consumer ran?); Kafka is at %d of the new log now, "+
				"which the consumer refuses as long as the watermark names the old log: check `kafkatx offsets status` and run the command again", s.Watermark, next, s.Target)
		}
		if err := o.store.AdoptLog(ctx, tx, group, s.TP, s.Watermark, s.Target, s.Log.Current.Topic, s.Log.Current.Cluster, s.AuditID); err != nil {
			return err
		}
	case ActionReplay:
		if next != s.Watermark {
			return fmt.Errorf("the watermark moved from %d to %d since the plan (a consumer ran?); Kafka is at %d now, "+
				"which the consumer repairs by re-committing the watermark: run the command again", s.Watermark, next, s.Target)
		}
		if err := o.store.Advance(ctx, tx, group, s.TP, "", s.Watermark, s.Target, -1); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE `+o.t.Watermarks+` SET replay_epoch = replay_epoch + 1
			WHERE group_id = $1 AND topic = $2 AND partition = $3`, group, s.Topic, s.Partition); err != nil {
			return fmt.Errorf("open replay epoch: %w", err)
		}
		// A replay runs everything from the target again, including offsets a consumer with
		// Config.Concurrency > 1 had applied above the old watermark.
		if err := o.store.DeleteDone(ctx, tx, group, s.TP, -1); err != nil {
			return err
		}
		// Parked messages (kafkatx.Config.Park) at or above the target are read again from
		// Kafka by the replay: their rows go, or they would run twice. Those below it stay
		// parked, and their keys' replayed messages park behind them (a key's order kept).
		// A skip leaves parked messages alone (they were read; the skip moves past offsets
		// never read), and so does an adoption (the old log's parked messages are kept whole
		// in their rows and still run).
		if _, err := parking.New(o.t.Schema).DeleteTx(ctx, tx, group, s.Topic, s.Partition, s.Target); err != nil {
			return err
		}
	}
	if err := o.store.SetEventStatus(ctx, tx, s.AuditID, StatusApplied); err != nil {
		return err
	}
	s.Done = StatusApplied
	return nil
}

func (o *Operator) abandon(ctx context.Context, steps []*Step) {
	for _, s := range steps {
		_, _ = o.pool.Exec(ctx, `UPDATE `+o.t.OffsetAudit+` SET status = 'abandoned' WHERE id = $1 AND status = 'pending'`, s.AuditID)
	}
}
