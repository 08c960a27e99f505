package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/kafkatx/kafkatx/shards"
)

// resetOnShard, with --shard, finds the shard that holds every partition the reset targets
// (--partition, or every partition of --topic) and returns the Globals of that shard alone:
// its URL as --database-url and no --shard, so that the plan, the watermark change, its audit
// row and the Airflow ledger read by --mode skip are all that shard's. A partition is on the
// shard holding its watermark, else on the shard the directory maps it to, else on the first
// --shard (where its first assignment would place it). Refused (exit 2, nothing changed): the
// partitions are on several shards (run it per partition with --partition), or one is being
// moved (finish the move with kafkatx shards move first).
func (c *OffsetsResetCmd) resetOnShard(ctx context.Context, g *Globals) (*Globals, error) {
	us, err := g.shardURLs()
	if err != nil {
		return nil, err
	}
	ops, closeAll, err := g.offsetsOperators(ctx, true)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	sts, err := shardStatus(ctx, ops, c.Group, c.Topic)
	if err != nil {
		return nil, err
	}
	dirPool, err := g.pool(ctx)
	if err != nil {
		return nil, err
	}
	defer dirPool.Close()
	entries, err := shards.NewDirectory(dirPool, g.Schema).List(ctx, c.Group)
	if err != nil {
		return nil, fmt.Errorf("shard directory: %w", err)
	}
	mapped := map[int32]shards.Entry{}
	for _, e := range entries {
		if e.Topic == c.Topic {
			mapped[e.Partition] = e
		}
	}
	parts := map[string][]int32{} // shard -> partitions
	var order []string
	place := func(p int32, held string) error {
		e, ok := mapped[p]
		if ok && e.State == shards.StateMoving {
			return &exitError{code: exitUsage, err: fmt.Errorf("partition %d of %s is being moved from shard %s to shard %s: finish the move first (kafkatx shards move --to %s, the same flags), then reset it on its shard",
				p, termText(c.Topic), termText(e.Shard), termText(e.MovingTo), shellQuote(e.MovingTo))}
		}
		shard := held
		switch {
		case shard != "":
		case ok:
			shard = e.Shard
		default:
			shard = us[0].name
		}
		if _, seen := parts[shard]; !seen {
			order = append(order, shard)
		}
		parts[shard] = append(parts[shard], p)
		return nil
	}
	found := false
	for _, s := range sts {
		if c.Partition != nil && s.Partition != *c.Partition {
			continue
		}
		found = true
		if err := place(s.Partition, s.Shard); err != nil {
			return nil, err
		}
	}
	if c.Partition != nil && !found { // not in Kafka's list: where the directory says, as the plan will tell
		if err := place(*c.Partition, ""); err != nil {
			return nil, err
		}
	}
	if len(order) > 1 {
		var where []string
		for _, sh := range order {
			ps := parts[sh]
			slices.Sort(ps)
			where = append(where, fmt.Sprintf("shard %s holds %s", termText(sh), strings.Trim(fmt.Sprint(ps), "[]")))
		}
		return nil, &exitError{code: exitUsage, err: fmt.Errorf("offsets reset acts on one shard at a time, and the partitions of %s are on several (%s): reset them with --partition, one partition at a time",
			termText(c.Topic), strings.Join(where, "; "))}
	}
	if len(order) == 0 {
		return g, nil // no partition: the plan says so
	}
	one := *g
	one.Shard = nil
	one.DatabaseURLFile = ""
	for _, u := range us {
		if u.name == order[0] {
			one.DatabaseURL = u.url
		}
	}
	if one.DatabaseURL == "" {
		return nil, &exitError{code: exitUsage, err: fmt.Errorf("partitions %s of %s are on shard %s, which no --shard names: pass every shard of the service", strings.Trim(fmt.Sprint(parts[order[0]]), "[]"), termText(c.Topic), termText(order[0]))}
	}
	fmt.Fprintf(os.Stdout, "shard %s: the reset acts on its database (partitions %s)\n", termText(order[0]), strings.Trim(fmt.Sprint(parts[order[0]]), "[]"))
	return &one, nil
}
