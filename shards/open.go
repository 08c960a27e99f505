package shards

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/pg"
)

// Spec is one shard as a command line names it: --shard NAME=URL.
type Spec struct {
	Name string
	URL  string
}

// ParseSpecs parses shard specs "NAME=URL", in order (the first shard takes the partitions the
// directory does not map yet). Refused, naming the spec by its 1-based position and never
// quoting a URL (any part of it may be the password): a spec without '=' or with an empty URL,
// a name CheckName refuses, a name given twice, a URL pg.ParseConfig cannot parse. Nothing
// connects. Empty input gives nil.
func ParseSpecs(specs []string) ([]Spec, error) {
	var out []Spec
	for i, s := range specs {
		name, url, ok := strings.Cut(s, "=")
		if !ok || url == "" {
			return nil, fmt.Errorf("--shard %d: want NAME=URL", i+1)
		}
		if err := CheckName(name); err != nil {
			return nil, fmt.Errorf("--shard %d: %w", i+1, err)
		}
		for _, u := range out {
			if u.Name == name {
				return nil, fmt.Errorf("--shard: shard %q named twice", name)
			}
		}
		if _, err := pg.ParseConfig(url); err != nil {
			return nil, fmt.Errorf("--shard %s: %w", name, err)
		}
		out = append(out, Spec{Name: name, URL: url})
	}
	return out, nil
}

// OpenOptions configures Open.
type OpenOptions struct {
	// Directory is the pool of the directory's database (Set.Directory). Required.
	Directory *pgxpool.Pool
	// DirectoryURL is the URL Directory was opened on: a shard whose URL is exactly this one
	// shares Directory instead of opening a pool of its own. Empty: every shard opens its own.
	DirectoryURL string
	// MinConns, when > 0, is the least connection budget of each shard's pool (its MaxConns)
	// unless the shard's URL sets pool_max_conns itself; 0 keeps pgxpool's default,
	// max(4, CPUs).
	MinConns int32
	// Configure, when set, is called on each shard's pool configuration before the pool
	// opens (after MinConns), with the shard's name: tracing, AfterConnect, a smaller budget.
	Configure func(name string, cfg *pgxpool.Config)
}

// Open opens a pool on every shard of specs (ParseSpecs) and pings it, and returns the set in
// specs' order; Set.Close closes the pools it opened (never Directory). Two shards that reach
// one database (by two URLs) are refused, naming both. A URL that goes through
// a transaction pooler is probed as pg.ParsePoolConfig does. On any error the pools already
// opened are closed and the error names the shard (pgx's errors name the user and database,
// never the password). No specs: nil, nil.
func Open(ctx context.Context, specs []Spec, o OpenOptions) (*Set, error) {
	if len(specs) == 0 {
		return nil, nil
	}
	if o.Directory == nil {
		return nil, errors.New("shards: Open needs the directory's pool")
	}
	set := &Set{Directory: o.Directory}
	for _, u := range specs {
		if o.DirectoryURL != "" && u.URL == o.DirectoryURL {
			set.Shards = append(set.Shards, Shard{Name: u.Name, Pool: o.Directory})
			continue
		}
		p, err := openShard(ctx, u, o)
		if err != nil {
			set.Close()
			return nil, fmt.Errorf("shard %s: %w", u.Name, err)
		}
		set.opened = append(set.opened, p)
		set.Shards = append(set.Shards, Shard{Name: u.Name, Pool: p})
	}
	if err := refuseOneDatabaseTwice(ctx, set); err != nil {
		set.Close()
		return nil, err
	}
	return set, nil
}

// refuseOneDatabaseTwice refuses two shards that reach one database (two URLs for it, such as
// another host name or other parameters): the directory would take them for two, and a move
// from one to the other locks the partition's watermark row on the source and then waits for
// that same row on the "target", forever. A database is told by its server's system
// identifier (pg_control_system; where a role may not read it, the postmaster's start time)
// and its name.
func refuseOneDatabaseTwice(ctx context.Context, set *Set) error {
	seen := map[string]string{} // identity -> shard
	for _, sh := range set.Shards {
		var id string
		err := sh.Pool.QueryRow(ctx, `SELECT (SELECT system_identifier FROM pg_control_system())::text || '/' || current_database()`).Scan(&id)
		if err != nil {
			err = sh.Pool.QueryRow(ctx, `SELECT pg_postmaster_start_time()::text || '/' || current_database()`).Scan(&id)
		}
		if err != nil {
			return fmt.Errorf("shard %s: %w", sh.Name, err)
		}
		if other, ok := seen[id]; ok {
			_, db, _ := strings.Cut(id, "/")
			return fmt.Errorf("shards %s and %s are one database (%s on one server): give each database one shard name", other, sh.Name, db)
		}
		seen[id] = sh.Name
	}
	return nil
}

func openShard(ctx context.Context, u Spec, o OpenOptions) (*pgxpool.Pool, error) {
	cfg, _, err := pg.ParsePoolConfig(ctx, u.URL)
	if err != nil {
		return nil, err
	}
	if o.MinConns > 0 && !strings.Contains(u.URL, "pool_max_conns") {
		cfg.MaxConns = max(cfg.MaxConns, o.MinConns)
	}
	if o.Configure != nil {
		o.Configure(u.Name, cfg)
	}
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := p.Ping(ctx); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// Close closes the pools Open opened (not the directory's, nor a shard sharing it); a Set
// built by hand closes nothing. Safe on nil.
func (s *Set) Close() {
	if s == nil {
		return
	}
	for _, p := range s.opened {
		p.Close()
	}
	s.opened = nil
}
