package main

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
)

// shardDB is one database a command reading a group's state covers: a shard (shard its
// name) or, without --shard, --database-url's (shard "").
type shardDB struct {
	shard string
	pool  *pgxpool.Pool
}

// shardDBs returns the databases a command reading a group's state covers: with --shard every
// shard in the flags' order, each first checked by check when not nil (its error prefixed with
// the shard's name); without --shard, pool alone, unchecked (the caller opened and checked
// it). pool is --database-url's, the shard directory's. closeAll closes the shards' pools it
// opened, never pool.
func (g *Globals) shardDBs(ctx context.Context, pool *pgxpool.Pool, check func(context.Context, *pgxpool.Pool, string) error) ([]shardDB, func(), error) {
	if len(g.Shard) == 0 {
		return []shardDB{{pool: pool}}, func() {}, nil
	}
	set, closeAll, err := g.shardSet(ctx, pool)
	if err != nil {
		return nil, nil, err
	}
	out := make([]shardDB, 0, len(set.Shards))
	for _, sh := range set.Shards {
		if check != nil {
			if err := check(ctx, sh.Pool, g.Schema); err != nil {
				closeAll()
				return nil, nil, shardErr(sh.Name, err)
			}
		}
		out = append(out, shardDB{shard: sh.Name, pool: sh.Pool})
	}
	return out, closeAll, nil
}

// eachShard runs fn on each database of shardDBs in turn (every shard with --shard, pool
// alone without): the first error stops it, prefixed with its shard's name.
func (g *Globals) eachShard(ctx context.Context, pool *pgxpool.Pool, check func(context.Context, *pgxpool.Pool, string) error, fn func(db shardDB) error) error {
	dbs, closeAll, err := g.shardDBs(ctx, pool, check)
	if err != nil {
		return err
	}
	defer closeAll()
	for _, db := range dbs {
		if err := fn(db); err != nil {
			return shardErr(db.shard, err)
		}
	}
	return nil
}
