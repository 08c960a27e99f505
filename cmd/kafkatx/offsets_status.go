package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/kafkatx/kafkatx/internal/offsets"
	"github.com/kafkatx/kafkatx/internal/offsetstate"
)

// OffsetsStatusCmd compares each partition's database watermark with the group's committed
// offset in Kafka.
type OffsetsStatusCmd struct {
	Group        string        `required:"" help:"Consumer group id."`
	Topic        string        `help:"Only this topic (default: every topic the group has a watermark or a committed offset on)."`
	Output       string        `default:"text" enum:"text,json,prometheus" help:"text, json (one object per partition per line) or prometheus (text exposition format, for node_exporter's textfile collector)."`
	StalledAfter time.Duration `name:"stalled-after" default:"2m" help:"A partition with lag whose watermark has not moved for this long is stalled (a stuck handler, an open breaker, no consumer running): not aligned, exit 8."`
}

// Help is the long help of offsets status.
func (OffsetsStatusCmd) Help() string {
	return `Per partition: the database watermark (next offset to process), Kafka's committed offset,
the log start and end offsets, lag (log end - watermark), drift (committed - watermark), the
state, and the last offset audit event.

States: aligned; kafka_ahead (an offset move with Kafka's own tools, or a database restored
from an older backup: the consumer follows it and audits the skipped range); kafka_behind (a
lost commit or a rewind with Kafka's tools: the consumer re-commits the watermark);
kafka_missing (the group's offsets expired or were deleted); watermark_past_log_end (the
topic was recreated or truncated: the consumer refuses to start), watermark_below_log_start
(retention removed unprocessed records), kafka_past_log_end (the consumer ignores it);
log_changed (the log behind the watermark is another one: the topic was deleted and created
again, or the brokers are another cluster — its topic or cluster id differs from the one
recorded with the watermark; the consumer refuses to start until the new log is adopted with
offsets reset --mode adopt); no_watermark and unused (not drift).

With --shard (a sharded group): each partition as its mapped shard (the shard directory)
holds it, in a SHARD column; a watermark on a shard the directory does not map the
partition to — a shard restored from an older backup, a copy a failed move left — is named
STALE-COPY (JSON: stale_copies) and counts as drift (exit 3): consumers never apply there.

Stalled: a partition with lag whose watermark has not moved for --stalled-after (default 2m)
makes no progress — a handler stuck, the breaker open, a database condition waited out, or no
consumer running — whatever its state; the text output marks it STALLED.

Exit status: 0 when every partition is aligned (or has no watermark) and none is stalled, 3
when any partition drifts (kafka_ahead, kafka_behind, kafka_missing, watermark_past_log_end,
watermark_below_log_start, kafka_past_log_end), 9 when any is log_changed (before 3), 8 when
none drifts but one is stalled, 7 when
the group has no watermark and no committed offset (a mistyped group), 1 on an error.`
}

func (c *OffsetsStatusCmd) Run(ctx context.Context, g *Globals) error {
	if err := offsetsOutput(c.Output, "text", "json", "prometheus"); err != nil {
		return err
	}
	ops, closeAll, err := g.offsetsOperators(ctx, true)
	if err != nil {
		return err
	}
	defer closeAll()
	op := ops[0].op
	sts, err := shardStatus(ctx, ops, c.Group, c.Topic)
	if err != nil {
		return err
	}
	drifted, stalled, changed, staleCopies := 0, 0, 0, 0
	now := time.Now()
	for _, s := range sts {
		if s.Drifted() || len(s.StaleCopies) > 0 {
			drifted++
		}
		if len(s.StaleCopies) > 0 {
			staleCopies++
		}
		if s.State == offsetstate.LogChanged {
			changed++
		}
		if s.Stalled(c.StalledAfter, now) {
			stalled++
		}
	}
	switch c.Output {
	case "json":
		enc := json.NewEncoder(os.Stdout)
		for _, s := range sts {
			if err := enc.Encode(s); err != nil {
				return err
			}
		}
	case "prometheus":
		if err := offsets.WritePrometheus(os.Stdout, sts); err != nil {
			return err
		}
	default:
		grp, err := op.Group(ctx, c.Group)
		if err != nil {
			return err
		}
		fmt.Printf("group %s: %s, %d active member(s)\n", termText(c.Group), termText(grp.State), len(grp.Members))
		tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
		if len(ops) > 1 {
			fmt.Fprint(tw, "SHARD\t")
		}
		fmt.Fprintln(tw, "TOPIC\tPARTITION\tWATERMARK\tCOMMITTED\tLOG-START\tLOG-END\tLAG\tDRIFT\tSTATE\tLAST EVENT")
		for _, s := range sts {
			last := "-"
			if e := s.LastEvent; e != nil {
				last = fmt.Sprintf("%s %s %s %s", termText(e.Kind), eventSpan(e.Kind, e.From, e.To), termText(e.Status), e.At.UTC().Format("2006-01-02T15:04:05Z"))
			}
			for _, p := range s.Pending {
				last += fmt.Sprintf("; PENDING %s %s id %d", termText(p.Kind), eventSpan(p.Kind, p.From, p.To), p.ID)
			}
			if s.Parked > 0 {
				last += fmt.Sprintf("; %d messages of %d keys parked below the watermark (Config.Park)", s.Parked, s.ParkedKeys)
			}
			if s.DoneAbove > 0 {
				last += fmt.Sprintf("; %d offsets done above the watermark (Config.Concurrency > 1)", s.DoneAbove)
			}
			state := termText(string(s.State))
			if s.Stalled(c.StalledAfter, now) {
				state += " STALLED"
			}
			for _, sc := range s.StaleCopies {
				state += fmt.Sprintf(" STALE-COPY(shard %s at %d)", termText(sc.Shard), sc.Watermark)
			}
			lag := strconv.FormatInt(s.Lag, 10)
			if s.State == offsetstate.LogChanged {
				lag += " (new log)" // the watermark is an offset of the old log: not subtracted (offsets.PartitionStatus.Lag)
			}
			if len(ops) > 1 {
				fmt.Fprintf(tw, "%s\t", orDash(termText(s.Shard)))
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n", termText(s.Topic), s.Partition, offsetsOpt(s.Watermark), offsetsOpt(s.Committed),
				s.LogStart, s.LogEnd, lag, offsetsSigned(s.Drift), state, last)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		switch {
		case len(sts) == 0:
			fmt.Printf("group %s has no watermark and no committed offset%s\n", termText(c.Group), map[bool]string{true: " on " + termText(c.Topic), false: ""}[c.Topic != ""])
		case staleCopies > 0 && drifted == staleCopies:
			fmt.Printf("STALE COPY: %d of %d partition(s) have a watermark on a shard the shard directory does not map them to (a shard restored from an older backup, or what a failed move left); consumers never apply there and the partition's numbers above are its mapped shard's: check the copy and delete it on that shard (docs/deployment.md, sharding)\n",
				staleCopies, len(sts))
		case drifted > 0:
			if staleCopies > 0 {
				fmt.Printf("STALE COPY on %d partition(s): a watermark on a shard the shard directory does not map them to (see STALE-COPY above; docs/deployment.md, sharding)\n", staleCopies)
			}
			fmt.Printf("DRIFT on %d of %d partition(s). What starting the consumer will do, and the command for the other choice:\n", drifted, len(sts))
			for _, h := range offsets.Hints(g.Schema, c.Group, sts, shellQuote) {
				fmt.Printf("- %s\n", h)
			}
		case stalled > 0:
			fmt.Printf("STALLED: %d of %d partition(s) have lag and a watermark that has not moved for %s: a handler stuck, the breaker open, a database condition waited out, or no consumer running (see the consumer's /readyz)\n",
				stalled, len(sts), c.StalledAfter)
		default:
			fmt.Printf("aligned: %d partition(s)\n", len(sts))
		}
	}
	if changed > 0 {
		return &exitError{code: offsetsExitLogChanged}
	}
	if drifted > 0 {
		return &exitError{code: offsetsExitDrift}
	}
	if stalled > 0 {
		return &exitError{code: offsetsExitStalled}
	}
	if len(sts) == 0 {
		// A mistyped group name must not look healthy to a monitoring check.
		return &exitError{code: offsetsExitUnknown}
	}
	return nil
}

func offsetsOpt(v *int64) string {
	if v == nil {
		return "-"
	}
	return strconv.FormatInt(*v, 10)
}

func offsetsSigned(v *int64) string {
	switch {
	case v == nil:
		return "-"
	case *v > 0:
		return "+" + strconv.FormatInt(*v, 10)
	}
	return strconv.FormatInt(*v, 10)
}
