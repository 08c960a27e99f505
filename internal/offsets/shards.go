package offsets

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/kafkatx/kafkatx/internal/offsetstate"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/shards"
)

// ShardOperator is the Operator of one shard (Operator.On its pool), named as the directory
// names it.
type ShardOperator struct {
	Shard string
	Op    *Operator
}

// ShardedStatus is Status over every shard of set (ops: one operator per shard, in set's
// order; schema: the directory's): each partition as read on the shard the
// directory maps it to (Shard set; while it is being moved, the target once the shard it
// leaves no longer holds its watermark); a partition the directory does not map, as read on
// the shard that holds its watermark, or, held nowhere yet, on the first shard. A watermark
// row on a shard the directory does not map the partition to is listed in StaleCopies
// (shards.StaleCopies), never shown as the partition's.
func ShardedStatus(ctx context.Context, set *shards.Set, schema string, ops []ShardOperator, group, topic string) ([]PartitionStatus, error) {
	es, err := shards.NewDirectory(set.Directory, schema).List(ctx, group)
	if err != nil {
		return nil, err
	}
	entries := make(map[offsetstore.TP]shards.Entry, len(es))
	for _, e := range es {
		entries[offsetstore.TP{Topic: e.Topic, Partition: e.Partition}] = e
	}
	copies, err := shards.StaleCopies(ctx, set, schema, group)
	if err != nil {
		return nil, err
	}
	stale := map[offsetstore.TP][]StaleCopy{}
	isStale := map[offsetstore.TP]map[string]bool{}
	for _, c := range copies {
		tp := offsetstore.TP{Topic: c.Topic, Partition: c.Partition}
		stale[tp] = append(stale[tp], StaleCopy{Shard: c.Shard, Watermark: c.Watermark})
		if isStale[tp] == nil {
			isStale[tp] = map[string]bool{}
		}
		isStale[tp][c.Shard] = true
	}
	var out []PartitionStatus
	at := map[offsetstore.TP]int{}
	ranks := map[offsetstore.TP]int{}
	for _, so := range ops {
		sts, err := so.Op.Status(ctx, group, topic)
		if err != nil {
			return nil, fmt.Errorf("shard %s: %w", so.Shard, err)
		}
		for _, s := range sts {
			tp := offsetstore.TP{Topic: s.Topic, Partition: s.Partition}
			if isStale[tp][so.Shard] {
				continue // listed in the mapped shard's row (StaleCopies)
			}
			e, mapped := entries[tp]
			home := mapped && so.Shard == e.Shard
			if s.Watermark != nil || home {
				s.Shard = so.Shard
			}
			// The mapped shard's watermark, else any watermark (the move's target once the
			// shard it leaves lost its row; an unmapped partition's), else the mapped shard's
			// view, else the first shard's.
			rank := 0
			switch {
			case s.Watermark != nil && home:
				rank = 3
			case s.Watermark != nil:
				rank = 2
			case home:
				rank = 1
			}
			i, seen := at[tp]
			switch {
			case !seen:
				at[tp] = len(out)
				out = append(out, s)
			case rank > ranks[tp]:
				out[i] = s
			default:
				continue
			}
			ranks[tp] = rank
		}
	}
	for i := range out {
		out[i].StaleCopies = stale[offsetstore.TP{Topic: out[i].Topic, Partition: out[i].Partition}]
	}
	// A partition only a stale copy names (no committed offset, no watermark where mapped).
	for tp, cs := range stale {
		if _, seen := at[tp]; seen || (topic != "" && tp.Topic != topic) {
			continue
		}
		at[tp] = len(out)
		out = append(out, PartitionStatus{Shard: entries[tp].Shard, Group: group, Topic: tp.Topic, Partition: tp.Partition,
			State: offsetstate.NoWatermark, StaleCopies: cs})
	}
	slices.SortFunc(out, func(a, b PartitionStatus) int {
		return cmp.Or(strings.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	return out, nil
}
