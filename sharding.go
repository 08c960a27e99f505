package kafkatx

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/engine"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/shards"
)

// pools is every database Run prepares: the consumer's pool, then (with Config.Shards) the
// directory's and each shard's, each once.
func (c *Consumer) pools() []*pgxpool.Pool {
	out := []*pgxpool.Pool{c.pool}
	if c.shards == nil {
		return out
	}
	seen := map[*pgxpool.Pool]bool{c.pool: true}
	for _, p := range append([]*pgxpool.Pool{c.shards.Directory}, poolsOf(c.shards)...) {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
}

func poolsOf(s *shards.Set) []*pgxpool.Pool {
	out := make([]*pgxpool.Pool, len(s.Shards))
	for i, sh := range s.Shards {
		out[i] = sh.Pool
	}
	return out
}

// placer reads the shard directory for the engine at each assignment (engine.Placer).
type placer struct {
	set   *shards.Set
	dir   *shards.Directory
	store *offsetstore.Store
}

func placerOf(s *shards.Set, schema string) engine.Placer {
	if s == nil {
		return nil
	}
	return &placer{set: s, dir: shards.NewDirectory(s.Directory, schema), store: offsetstore.New(schema)}
}

// Place maps each partition to its directory row's shard; a partition without a row is
// placed on the first shard. A row naming a shard this service was not given is an error
// (the assignment is reconciled again), never a silent placement elsewhere.
func (p *placer) Place(ctx context.Context, group string, tps []offsetstore.TP) (map[offsetstore.TP]engine.Placement, error) {
	byTopic := map[string][]int32{}
	for _, tp := range tps {
		byTopic[tp.Topic] = append(byTopic[tp.Topic], tp.Partition)
	}
	out := make(map[offsetstore.TP]engine.Placement, len(tps))
	for topic, parts := range byTopic {
		es, err := p.dir.Place(ctx, group, topic, parts, p.set.Shards[0].Name)
		if err != nil {
			return nil, err
		}
		for _, part := range parts {
			e, ok := es[part]
			if !ok {
				return nil, fmt.Errorf("the shard directory has no row for partition %d of %s after placing it", part, topic)
			}
			if e.State == shards.StateMoving {
				if e, err = p.moving(ctx, e); err != nil {
					return nil, err
				}
			}
			pool := p.set.Pool(e.Shard)
			if pool == nil {
				return nil, fmt.Errorf("the shard directory maps partition %d of %s (group %s) to shard %q, which this service was not given (it has %v)",
					part, topic, group, e.Shard, p.set.Names())
			}
			out[offsetstore.TP{Topic: topic, Partition: part}] = engine.Placement{Shard: e.Shard, Pool: pool, Epoch: e.Epoch}
		}
	}
	return out, nil
}

// ConfirmFirstRun is engine.FirstRunConfirmer: shards.Directory.ConfirmFirstRun in the
// transaction that writes the partition's first watermark on its shard.
func (p *placer) ConfirmFirstRun(ctx context.Context, tx pgx.Tx, group string, tp offsetstore.TP, pl engine.Placement) error {
	return p.dir.ConfirmFirstRun(ctx, tx, group, tp.Topic, tp.Partition, pl.Shard, pl.Epoch)
}

// moving resolves a row a move left "moving" (in progress, or its mover stopped): the
// partition is where its watermark row is — on the shard it leaves until the move deletes it
// there, then on the target — so a consumer never starts a partition over on a shard its state
// already left. When both hold a row, the shard it leaves is authoritative (the copy is
// written before the cut-over) unless the target's watermark is ahead of it: consumers applied
// there after the cut-over, so the row on the shard it left is a stale copy (that shard
// restored from an older backup) and is never applied on.
func (p *placer) moving(ctx context.Context, e shards.Entry) (shards.Entry, error) {
	from, to := p.set.Pool(e.Shard), p.set.Pool(e.MovingTo)
	if from == nil || to == nil {
		return e, nil // named in the error below, or the shard it leaves
	}
	tp := offsetstore.TP{Topic: e.Topic, Partition: e.Partition}
	ws, err := p.store.Watermarks(ctx, from, e.Group, []offsetstore.TP{tp})
	if err != nil {
		return e, fmt.Errorf("shard %s: %w", e.Shard, err)
	}
	w, held := ws[tp]
	if !held {
		e.Shard = e.MovingTo
		return e, nil
	}
	wt, err := p.store.Watermarks(ctx, to, e.Group, []offsetstore.TP{tp})
	if err != nil {
		return e, fmt.Errorf("shard %s: %w", e.MovingTo, err)
	}
	if c, ok := wt[tp]; ok && c.Next > w.Next {
		e.Shard = e.MovingTo
	}
	return e, nil
}
