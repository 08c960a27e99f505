package shards

import (
	"context"
	"fmt"
)

// Copy is one partition's watermark row found on one shard.
type Copy struct {
	Group     string `json:"group"`
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Shard     string `json:"shard"`
	Watermark int64  `json:"watermark"`
}

// Holds reports whether the directory row e lets shard hold the partition's state: the shard
// named, or, while a move is in progress, its target too (the copy Move's step 2 wrote).
func (e Entry) Holds(shard string) bool {
	return shard == e.Shard || (e.State == StateMoving && shard == e.MovingTo)
}

// StaleCopies lists the stale copies of group's partitions (every group when group is ""): a
// watermark row on a shard of set the directory does not map the partition to (Entry.Holds).
// A partition the directory has no row for has no stale copy (its first assignment writes
// the row before any watermark). A stale copy is what a shard restored from an older backup
// holds for a partition moved away since, or what a move that crashed and was then finished
// by hand left: consumers never apply there (they read the directory at every assignment, and
// a move deletes the old shard's row in its cut-over, which fences the old owner), but its
// numbers are not the partition's; an operator checks and deletes it. Ordered by shard (set's
// order), then group, topic and partition.
func StaleCopies(ctx context.Context, set *Set, schema, group string) ([]Copy, error) {
	if err := set.Validate(); err != nil {
		return nil, err
	}
	d := NewDirectory(set.Directory, schema)
	es, err := d.List(ctx, group)
	if err != nil {
		return nil, err
	}
	type key struct {
		group, topic string
		partition    int32
	}
	mapped := make(map[key]Entry, len(es))
	for _, e := range es {
		mapped[key{e.Group, e.Topic, e.Partition}] = e
	}
	var out []Copy
	for _, sh := range set.Shards {
		rows, err := sh.Pool.Query(ctx, `SELECT group_id, topic, partition, next_offset FROM `+d.t.Watermarks+`
			WHERE $1 = '' OR group_id = $1 ORDER BY group_id, topic, partition`, group)
		if err != nil {
			return nil, fmt.Errorf("shard %s: read the watermarks: %w", sh.Name, err)
		}
		for rows.Next() {
			c := Copy{Shard: sh.Name}
			if err := rows.Scan(&c.Group, &c.Topic, &c.Partition, &c.Watermark); err != nil {
				rows.Close()
				return nil, fmt.Errorf("shard %s: read the watermarks: %w", sh.Name, err)
			}
			e, ok := mapped[key{c.Group, c.Topic, c.Partition}]
			if ok && !e.Holds(sh.Name) {
				out = append(out, c)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("shard %s: read the watermarks: %w", sh.Name, err)
		}
	}
	return out, nil
}
