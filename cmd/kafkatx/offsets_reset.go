package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/kafkatx/kafkatx/internal/offsets"
)

// OffsetsResetCmd moves a group's database watermarks and Kafka committed offsets together.
type OffsetsResetCmd struct {
	Group      string `required:"" help:"Consumer group id."`
	Topic      string `required:"" help:"Topic."`
	Partition  *int32 `help:"Only this partition (default: every partition of the topic)."`
	ToOffset   *int64 `name:"to-offset" xor:"target" help:"Move to this offset." placeholder:"N"`
	ToTime     string `name:"to-time" xor:"target" help:"Move to the first offset whose record timestamp is at or after this RFC 3339 time (the log end when none is)." placeholder:"RFC3339"`
	ToEarliest bool   `name:"to-earliest" xor:"target" help:"Move to the log start offset."`
	ToLatest   bool   `name:"to-latest" xor:"target" help:"Move to the log end offset."`
	ToDatabase bool   `name:"to-database" xor:"target" help:"Align Kafka's committed offset to the database watermark (the watermark does not move; --mode is not needed)."`
	Mode       string `help:"skip (move forward; the range is recorded as operator_skip and never processed), replay (move back; the range runs again under a new replay epoch) or adopt (the topic was recreated or the cluster is another one: move onto the new log, audited as log_adopted with both ids)." placeholder:"skip|replay|adopt"`
	Reason     string `required:"" help:"Why, for the audit trail."`
	Execute    bool   `help:"Apply the plan. Without it the command only prints the plan (a dry run)."`
	// Airflow: what a skip touches there (docs/offsets.md, Airflow in lockstep).
	AirflowAccess `embed:""`
	ClearAirflow  bool  `name:"clear-airflow" help:"With --mode skip, --airflow-url and --execute: mark failed (with a note) each run of the Airflow ledger's rows in the skipped range and the --airflow-before offsets below it that is still queued, and delete the asset queue rows their asset events are in; audited as airflow_clear."`
	AirflowBefore int64 `name:"airflow-before" default:"100" help:"How many offsets below a skipped range's start the Airflow ledger is read for runs and asset events still queued in Airflow (the skip's neighbourhood)." placeholder:"N"`
}

// Help is the long help of offsets reset.
func (OffsetsResetCmd) Help() string {
	return `Moves the database watermark and Kafka's committed offset in lockstep, with an audit row
(who: the OS user at the host; when; why; the range). A dry run by default: it prints the plan
and changes nothing; --execute applies it.

  --mode skip     [watermark, target) is recorded as operator_skip; both sides move to target.
  --mode replay   [target, watermark) runs again; both sides move back to target and the
                  partition's replay epoch goes up by one (business idempotency keys are scoped
                  by epoch, so the replay is not swallowed as duplicates).
  --mode adopt    the log behind the watermark changed (offsets status: log_changed — the
                  topic was deleted and created again, or the brokers are another cluster):
                  both sides move to the target in the new log (--to-earliest: every record it
                  holds is processed; --to-latest; --to-time), the new topic and cluster ids are
                  recorded, and the audit row (log_adopted) names the old and new ids. Refused
                  when the log has not changed; skip and replay are refused when it has.
  --to-database   Kafka's committed offset is set to the watermark (audit kind align).

It refuses while the group has active members: stop every consumer of the group first.

A skip on a group that hands events to Airflow (its Airflow ledger has rows) also names the
ledger rows of the skipped range and of the --airflow-before offsets below it (default 100).
With --airflow-url and its credentials it reads their runs' states and the asset queue rows
they are in; --clear-airflow --execute then, after the skip, marks each run still queued
failed with a note naming the skip (failed, not deleted: its run id stays taken, so no replay
or airflow repair re-creates it) and deletes those asset queue rows, audited per partition as
airflow_clear. Run the same command again to finish a clear an Airflow failure interrupted.

With --shard NAME=URL ... (a sharded service's flags) the reset acts on the shard holding the
partitions it targets (its watermark, else its directory row, else the first --shard): the
plan, the change, its audit row and the Airflow ledger are that shard's. Partitions on several
shards, or one being moved, are refused (exit 2): reset one partition at a time with
--partition, after the move.

Exit status: 0 done (or a dry run with nothing in the way), 2 a usage error (an empty
--reason among them), 5 the group has active members, 1 on an error (for example a skip below
the watermark).`
}

// Validate checks the flag combinations kong cannot express.
func (c *OffsetsResetCmd) Validate() error {
	if c.Partition != nil && *c.Partition < 0 {
		return fmt.Errorf("--partition %d: partitions are numbered from 0", *c.Partition)
	}
	if strings.TrimSpace(c.Reason) == "" {
		return errors.New("--reason is empty: say why (it is recorded in the offset audit)")
	}
	if c.ToOffset != nil && *c.ToOffset < 0 {
		return fmt.Errorf("--to-offset %d: offsets are 0 or more (--to-earliest and --to-latest name the log's ends)", *c.ToOffset)
	}
	if c.ToOffset == nil && c.ToTime == "" && !c.ToEarliest && !c.ToLatest && !c.ToDatabase {
		return errors.New("a target is required: --to-offset N, --to-time RFC3339, --to-earliest, --to-latest or --to-database")
	}
	if !c.ToDatabase && c.Mode != string(offsets.ModeSkip) && c.Mode != string(offsets.ModeReplay) && c.Mode != string(offsets.ModeAdopt) {
		if c.Mode != "" {
			return fmt.Errorf("--mode %q: want skip, replay or adopt", c.Mode)
		}
		return errors.New("--mode skip|replay|adopt is required (except with --to-database)")
	}
	if c.ToDatabase && c.Mode != "" {
		return errors.New("--mode does not apply to --to-database, which moves only Kafka")
	}
	if _, err := offsets.TargetFrom(c.ToOffset, c.ToTime, c.ToEarliest, c.ToLatest); err != nil {
		return fmt.Errorf("--to-time: %w", err)
	}
	switch {
	case c.AirflowBefore < 0:
		return fmt.Errorf("--airflow-before %d: want 0 or more offsets", c.AirflowBefore)
	case c.ClearAirflow && c.Mode != string(offsets.ModeSkip):
		return errors.New("--clear-airflow goes with --mode skip")
	case c.ClearAirflow && !c.AirflowAccess.given():
		return errors.New("--clear-airflow needs --airflow-url and its credentials (--airflow-username and --airflow-password-file, or --airflow-token-file)")
	}
	return c.AirflowAccess.validate()
}

func (c *OffsetsResetCmd) request() offsets.ResetRequest {
	req := offsets.ResetRequest{Group: c.Group, Topic: c.Topic, Partition: -1, Mode: offsets.Mode(c.Mode), Reason: c.Reason, Actor: offsets.Actor()}
	if c.Partition != nil {
		req.Partition = *c.Partition
	}
	req.Target, _ = offsets.TargetFrom(c.ToOffset, c.ToTime, c.ToEarliest, c.ToLatest) // checked by Validate
	return req
}

func (c *OffsetsResetCmd) Run(ctx context.Context, g *Globals) error {
	sharded := len(g.Shard) > 0
	if sharded {
		one, err := c.resetOnShard(ctx, g)
		if err != nil {
			return err
		}
		g = one
	}
	op, closeAll, err := g.offsetsOperator(ctx, true)
	if err != nil {
		return err
	}
	defer closeAll()
	if !sharded { // the directory's database read as the group's: refused while it maps partitions elsewhere
		if err := g.checkDirectory(ctx, op.Pool()); err != nil {
			return err
		}
	}
	plan, err := op.PlanReset(ctx, c.request())
	if err != nil {
		return err
	}
	offsetsPrintPlan(plan)
	var ns []*skipNeighbourhood
	if c.Mode == string(offsets.ModeSkip) {
		if ns, err = c.airflowNeighbourhoods(ctx, g, plan); err != nil {
			return err
		}
		c.printNeighbourhoods(os.Stdout, ns)
	}
	if n := len(plan.Group.Members); n > 0 {
		fmt.Printf("REFUSED: group %s is %s with %d active member(s); stop every consumer of the group first\n", termText(c.Group), termText(plan.Group.State), n)
		return &exitError{code: offsetsExitActive, err: &offsets.ActiveGroupError{Group: c.Group, State: plan.Group.State, Members: plan.Group.Members}}
	}
	clear := c.ClearAirflow && slices.ContainsFunc(ns, (*skipNeighbourhood).clearable)
	if !plan.Changes() && !clear {
		fmt.Println("nothing to do")
		return nil
	}
	if !c.Execute {
		fmt.Println("dry run: nothing changed; run again with --execute to apply")
		return nil
	}
	if !plan.Changes() { // a clear run again after an interrupted one
		return c.clearNeighbourhoods(ctx, g, ns, os.Stdout)
	}
	err = op.ExecuteReset(ctx, plan)
	var active *offsets.ActiveGroupError
	if errors.As(err, &active) {
		return &exitError{code: offsetsExitActive, err: err}
	}
	for _, s := range plan.Steps {
		if s.AuditID != 0 {
			status := s.Done
			if status == "" {
				status = "NOT applied"
			}
			fmt.Printf("%s: %s, audit row %d\n", s.TP, status, s.AuditID)
		}
	}
	if err != nil {
		return err
	}
	if clear {
		for _, n := range ns {
			for _, s := range plan.Steps {
				if s.TP == n.tp {
					n.auditID = s.AuditID
				}
			}
		}
		if err := c.clearNeighbourhoods(ctx, g, ns, os.Stdout); err != nil {
			return err
		}
	}
	fmt.Println("done: `kafkatx offsets status` should report aligned")
	return nil
}

func offsetsPrintPlan(p *offsets.Plan) {
	r := p.Request
	what := "mode " + string(r.Mode)
	if r.Target.Kind == offsets.TargetDatabase {
		what = "align Kafka to the database"
	}
	fmt.Printf("plan: group %s, topic %s, %s, to %s\n  reason: %s\n  actor: %s\n", termText(r.Group), termText(r.Topic), what, r.Target, termText(r.Reason), termText(r.Actor))
	for _, s := range p.Steps {
		k := offsetsOpt(s.Committed)
		switch s.Action {
		case offsets.ActionSkip:
			fmt.Printf("  %s: watermark %d -> %d, Kafka committed %s -> %d: skip [%d, %d), %d message(s), as operator_skip\n",
				s.TP, s.Watermark, s.Target, k, s.Target, s.Watermark, s.Target, s.Messages())
		case offsets.ActionReplay:
			fmt.Printf("  %s: watermark %d -> %d, Kafka committed %s -> %d: replay [%d, %d), %d message(s), in a new replay epoch\n",
				s.TP, s.Watermark, s.Target, k, s.Target, s.Target, s.Watermark, s.Messages())
			if s.ParkedReplayed > 0 {
				fmt.Printf("    %d parked message(s) at or above %d: their rows are deleted and the replay reads them again from Kafka (their keys park again if they still fail)\n",
					s.ParkedReplayed, s.Target)
			}
		case offsets.ActionAlign:
			fmt.Printf("  %s: Kafka committed %s -> %d (the watermark), as align\n", s.TP, k, s.Target)
		case offsets.ActionAdopt:
			fmt.Printf("  %s: log changed (%s): watermark %d of the old log -> %d of the new one, Kafka committed %s -> %d: [%d, %d) of the new log processed; as log_adopted\n",
				s.TP, s.Log.What(), s.Watermark, s.Target, k, s.Target, s.Target, s.LogEnd)
		default:
			fmt.Printf("  %s: no change: %s\n", s.TP, termText(s.Note))
		}
	}
}
