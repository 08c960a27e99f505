package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/pg"
)

// checkDirectory refuses (usage status) a command that reads or changes a group's state when
// pool's database — --database-url's — holds a shard directory (kafkatx's shard_directory, in
// --schema) mapping partitions to shards that were not given with --shard: without them the
// command would read the directory's database as if it held the partitions' state and report a
// sharded group as never run ("no_watermark", "aligned") or point at the wrong remedy (a
// fresh-eyes attack). A database without the directory table, or with an empty one, passes.
func (g *Globals) checkDirectory(ctx context.Context, pool *pgxpool.Pool) error {
	t := tables.For(pg.SchemaOr(g.Schema))
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, t.ShardDirectory).Scan(&exists); err != nil {
		return fmt.Errorf("look for the shard directory: %w", err)
	}
	if !exists {
		return nil
	}
	rows, err := pool.Query(ctx, `SELECT DISTINCT s FROM (SELECT shard AS s FROM `+t.ShardDirectory+`
		UNION SELECT moving_to FROM `+t.ShardDirectory+` WHERE moving_to IS NOT NULL) x ORDER BY 1`)
	if err != nil {
		return fmt.Errorf("read the shard directory: %w", err)
	}
	named, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("read the shard directory: %w", err)
	}
	specs, err := g.shardURLs()
	if err != nil {
		return err
	}
	given := map[string]bool{}
	for _, s := range specs {
		given[s.name] = true
	}
	var missing []string
	for _, n := range named {
		if !given[n] {
			missing = append(missing, termText(n))
		}
	}
	switch {
	case len(missing) == 0:
		return nil
	case len(specs) == 0:
		return &exitError{code: exitUsage, err: fmt.Errorf("this database holds a shard directory that maps partitions to shards %s: give each with --shard NAME=URL (the flags the service runs with); without them the partitions' state would not be read",
			strings.Join(missing, ", "))}
	default:
		return &exitError{code: exitUsage, err: fmt.Errorf("the shard directory maps partitions to shards not given with --shard: %s (give every shard the service runs with)",
			strings.Join(missing, ", "))}
	}
}

// shardAware are the commands (kong's command paths, by prefix) that read or act on every
// shard given with --shard. Any other command reads --database-url's database only, so it
// refuses --shard rather than answer for the directory's database as if it were the group's
// (a fresh-eyes attack: console, outbox parked, relay and dlq show|replay|discard took the
// flag and read the directory's database, reporting nothing parked and no such dead letter).
var shardAware = []string{"migrate up", "shards ", "offsets status", "offsets audit", "offsets account", "offsets reset",
	"dlq list", "airflow status", "airflow repair", "parked-keys list", "console"}

// checkShardAware refuses --shard on a command outside shardAware, naming what to do instead.
func checkShardAware(command string, shards []string) error {
	if len(shards) == 0 {
		return nil
	}
	for _, p := range shardAware {
		if strings.HasPrefix(command+" ", p) || strings.HasPrefix(command, p) {
			return nil
		}
	}
	var words []string
	for _, w := range strings.Fields(command) {
		if !strings.HasPrefix(w, "<") && !strings.HasPrefix(w, "[") {
			words = append(words, w)
		}
	}
	return fmt.Errorf("--shard: %s does not read shards: run it with --database-url set to the one shard's database (shards status names the shard that holds each partition)",
		strings.Join(words, " "))
}
