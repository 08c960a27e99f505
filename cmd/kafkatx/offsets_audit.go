package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"text/tabwriter"

	"github.com/kafkatx/kafkatx/internal/offsets"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
)

// OffsetsAuditCmd prints the offset audit trail of a group.
type OffsetsAuditCmd struct {
	Group  string `required:"" help:"Consumer group id."`
	Topic  string `help:"Only this topic."`
	Output string `default:"text" enum:"text,json" help:"text or json (one object per line: id, group, topic, partition, kind, from_offset, to_offset, reason, actor, status, at)."`
}

// Help is the long help of offsets audit.
func (OffsetsAuditCmd) Help() string {
	return `Every change to a watermark that is not a processed batch, oldest first. Ranges are
half-open, [from_offset, to_offset). Kinds: ` + offsetstore.KindNames() + `.
status is ` + offsetstore.StatusPending + ` for a command recorded but not yet applied, ` + offsetstore.StatusApplied + `, or ` + offsetstore.StatusAbandoned + `.`
}

func (c *OffsetsAuditCmd) Run(ctx context.Context, g *Globals) error {
	if err := offsetsOutput(c.Output, "text", "json"); err != nil {
		return err
	}
	op, closeOp, err := g.offsetsOperator(ctx, false)
	if err != nil {
		return err
	}
	defer closeOp()
	var events []offsetstore.Event
	if err := g.eachShard(ctx, op.Pool(), offsetsCheckSchema, func(db shardDB) error { // every shard's rows, oldest first
		es, err := op.On(db.pool).Events(ctx, c.Group, c.Topic)
		for i := range es {
			es[i].Shard = db.shard
		}
		events = append(events, es...)
		return err
	}); err != nil {
		return err
	}
	sharded := len(g.Shard) > 1
	if sharded {
		sort.SliceStable(events, func(i, j int) bool { return events[i].At.Before(events[j].At) })
	}
	if c.Output == "json" {
		enc := json.NewEncoder(os.Stdout)
		for _, e := range events {
			if err := enc.Encode(e); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	shardCol := sharded
	if shardCol {
		fmt.Fprint(tw, "SHARD\t")
	}
	fmt.Fprintln(tw, "ID\tAT\tKIND\tSTATUS\tTOPIC\tPARTITION\tRANGE\tACTOR\tREASON")
	for _, e := range events {
		if shardCol {
			fmt.Fprintf(tw, "%s\t", termText(e.Shard))
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", e.ID, e.At.UTC().Format("2006-01-02T15:04:05Z"), termText(e.Kind), termText(e.Status),
			termText(e.Topic), e.Partition, eventSpan(e.Kind, e.From, e.To), termText(e.Actor), termText(e.Reason))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// How to undo each skip on record (the bytes of skipped messages are not kept).
	for _, e := range events {
		if h := offsets.UndoHint(g.Schema, e, shellQuote); h != "" {
			fmt.Printf("%s %s[%d] [%d, %d): %s\n", termText(e.Kind), termText(e.Topic), e.Partition, e.From, e.To, h)
		}
	}
	return nil
}
