package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/kafkatx/kafkatx/internal/offsets"
)

// OffsetsAccountCmd prints the offset accounting report of a group (or of one of its topics).
type OffsetsAccountCmd struct {
	Group     string `required:"" help:"Consumer group id."`
	Topic     string `help:"Only this topic (default: every topic the group has a watermark on, as the other offsets commands)."`
	Partition *int32 `help:"Only this partition, with --topic (default: every partition with a watermark)."`
	Output    string `default:"text" enum:"text,json" help:"text or json (one object per partition per line)."`
}

// Help is the long help of offsets account.
func (OffsetsAccountCmd) Help() string {
	return `Proves, per partition, that every offset from the first recorded one up to the watermark
is processed (by the handler), dead-lettered, or skipped (by a kafkatx command, or unexplained:
skipped with no command on record: Kafka moved ahead, or retention removed records first; listed separately). It reads only the database.

A gap is a watermark move nothing explains, for example an UPDATE of kafkatx.watermarks by
hand: a trigger records such moves as unexplained_move (see docs/offsets.md).

Exit status: 0 when every partition is accounted for, 4 when any has a gap, 1 on an error.`
}

// Validate refuses a negative --partition.
func (c *OffsetsAccountCmd) Validate() error {
	if c.Partition != nil && *c.Partition < 0 {
		return fmt.Errorf("--partition %d: partitions are numbered from 0", *c.Partition)
	}
	if c.Partition != nil && c.Topic == "" {
		return fmt.Errorf("--partition %d needs --topic: a partition number names a partition of one topic", *c.Partition)
	}
	return nil
}

func (c *OffsetsAccountCmd) Run(ctx context.Context, g *Globals) error {
	if err := offsetsOutput(c.Output, "text", "json"); err != nil {
		return err
	}
	op, closeOp, err := g.offsetsOperator(ctx, false)
	if err != nil {
		return err
	}
	defer closeOp()
	p := int32(-1)
	if c.Partition != nil {
		p = *c.Partition
	}
	// Each partition is accounted on the shard that holds its watermark (only there has it one).
	var accts []offsets.Account
	if err := g.eachShard(ctx, op.Pool(), offsetsCheckSchema, func(db shardDB) error {
		as, err := op.On(db.pool).Account(ctx, c.Group, c.Topic, p)
		for i := range as {
			as[i].Shard = db.shard
		}
		accts = append(accts, as...)
		return err
	}); err != nil {
		return err
	}
	if len(accts) == 0 {
		if c.Topic == "" {
			return fmt.Errorf("group %q has no watermark: nothing to account for", c.Group)
		}
		return fmt.Errorf("group %q has no watermark on topic %s: nothing to account for", c.Group, termText(c.Topic))
	}
	gaps := 0
	enc := json.NewEncoder(os.Stdout)
	for _, a := range accts {
		gaps += len(a.Gaps)
		if c.Output == "json" {
			if err := enc.Encode(a); err != nil {
				return err
			}
			continue
		}
		offsetsPrintAccount(a)
	}
	if gaps > 0 {
		if c.Output == "text" {
			fmt.Printf("GAP: %d unexplained watermark move(s); see above\n", gaps)
		}
		return &exitError{code: offsetsExitGap}
	}
	if c.Output == "text" {
		fmt.Println("accounted: every offset from the first recorded one to the watermark is processed, dead-lettered or skipped")
	}
	return nil
}

func offsetsPrintAccount(a offsets.Account) {
	on := ""
	if a.Shard != "" {
		on = " on shard " + termText(a.Shard)
	}
	fmt.Printf("%s[%d] group %s%s: offsets [%d, %d), %d in all\n", termText(a.Topic), a.Partition, termText(a.Group), on, a.First, a.Watermark, a.Offsets)
	if e := a.Adopted; e != nil {
		fmt.Printf("  new log since       audit row %d, %s: %s; the old log's history (watermark %d) is not counted\n", e.ID, e.At.UTC().Format("2006-01-02T15:04:05Z"), termText(e.Reason), e.From)
	}
	fmt.Printf("  processed           %d\n", a.Processed)
	fmt.Printf("  dead-lettered       %d\n", a.DeadLettered)
	if a.Parked > 0 {
		fmt.Printf("  parked              %d\n", a.Parked)
	}
	fmt.Printf("  operator-skipped    %d\n", a.OperatorSkipped)
	fmt.Printf("  unexplained skips   %d\n", a.UnexplainedSkipped)
	for _, s := range a.UnexplainedSkips {
		fmt.Printf("    [%d, %d) %d offset(s), audit row %d: skipped with no kafkatx command on record (see `kafkatx offsets audit` for its reason)\n", s.From, s.To, s.Len(), s.EventID)
	}
	for _, s := range a.RollbackReplays {
		fmt.Printf("    [%d, %d) %d offset(s) re-processed after a database rollback (a failover or a restore), audit row %d\n", s.From, s.To, s.Len(), s.EventID)
	}
	for _, s := range a.Segments {
		if s.Kind == offsets.SegOperatorSkip {
			fmt.Printf("    operator skip [%d, %d), audit row %d\n", s.From, s.To, s.EventID)
		}
	}
	if len(a.Gaps) == 0 {
		fmt.Println("  gaps                none")
		return
	}
	fmt.Printf("  gaps                %d\n", len(a.Gaps))
	for _, gp := range a.Gaps {
		who := ""
		if gp.Actor != "" {
			who = fmt.Sprintf(" by %s at %s", termText(gp.Actor), termText(gp.At))
		}
		fmt.Printf("    [%d, %d) %s%s\n", gp.From, gp.To, termText(gp.What), who)
	}
}
