package service

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/outbox/relays"
	"github.com/kafkatx/kafkatx/pg"
	"github.com/kafkatx/kafkatx/shards"
)

// ShardFlags is --shard NAME=URL, repeated (flag.Value): the shards of a sharded service, in
// order (the first takes the partitions the directory does not map yet).
type ShardFlags []ShardURL

// ShardURL is one --shard.
type ShardURL struct{ Name, URL string }

// String lists the shards' names (never their URLs, which may hold a password).
func (s *ShardFlags) String() string {
	var names []string
	for _, u := range *s {
		names = append(names, u.Name)
	}
	return strings.Join(names, ",")
}

// Set parses one NAME=URL: a bad or repeated name or a URL that does not parse is refused,
// without quoting the URL.
func (s *ShardFlags) Set(v string) error {
	name, url, ok := strings.Cut(v, "=")
	if !ok || url == "" {
		return errors.New("want NAME=URL")
	}
	if err := shards.CheckName(name); err != nil {
		return err
	}
	for _, u := range *s {
		if u.Name == name {
			return fmt.Errorf("shard %q named twice", name)
		}
	}
	if _, err := pg.ParseConfig(url); err != nil {
		return fmt.Errorf("shard %s: %w", name, err)
	}
	*s = append(*s, ShardURL{Name: name, URL: url})
	return nil
}

// Open opens a pool on every shard — a shard whose URL is dirURL shares dir, the directory's
// pool — with at least DefaultMaxConns connections each (the shard's connection budget in
// this process: pool_max_conns in its URL sets it), and returns the set; nil without --shard.
// closeAll closes what it opened.
func (s ShardFlags) Open(ctx context.Context, dir *pgxpool.Pool, dirURL string) (set *shards.Set, closeAll func(), err error) {
	if len(s) == 0 {
		return nil, func() {}, nil
	}
	var opened []*pgxpool.Pool
	closeAll = func() {
		for _, p := range opened {
			p.Close()
		}
	}
	set = &shards.Set{Directory: dir}
	for _, u := range s {
		if u.URL == dirURL {
			set.Shards = append(set.Shards, shards.Shard{Name: u.Name, Pool: dir})
			continue
		}
		cfg, _, err := pg.ParsePoolConfig(ctx, u.URL)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("shard %s: %w", u.Name, err)
		}
		if !strings.Contains(u.URL, "pool_max_conns") {
			cfg.MaxConns = max(cfg.MaxConns, DefaultMaxConns)
		}
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err == nil {
			if err = p.Ping(ctx); err != nil {
				p.Close()
			}
		}
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("shard %s: %w", u.Name, err)
		}
		opened = append(opened, p)
		set.Shards = append(set.Shards, shards.Shard{Name: u.Name, Pool: p})
	}
	return set, closeAll, nil
}

// shardRelays runs one relay per shard (table mode), each on its shard's pool with its own
// leadership lock and retention, its metrics labelled shard=NAME: one relays.Relay to Run.
type shardRelays struct {
	names []string
	rs    []relays.Relay
}

func newShardRelays(set *shards.Set, ro relays.Options, reg prometheus.Registerer) (*shardRelays, error) {
	out := &shardRelays{}
	for _, sh := range set.Shards {
		o := ro
		o.Session = nil // the shard's own pool's configuration
		o.Logger = ro.Logger.With(zap.String("shard", sh.Name))
		if reg != nil {
			o.Registerer = prometheus.WrapRegistererWith(prometheus.Labels{"shard": sh.Name}, reg)
		}
		rl, err := relays.New(sh.Pool, o)
		if err != nil {
			return nil, fmt.Errorf("shard %s: %w", sh.Name, err)
		}
		out.names = append(out.names, sh.Name)
		out.rs = append(out.rs, rl)
	}
	return out, nil
}

// Run runs every shard's relay until ctx ends; the first to fail stops the others and its
// error, naming the shard, is returned.
func (m *shardRelays) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(m.rs))
	for i, r := range m.rs {
		go func() {
			err := r.Run(ctx)
			if err != nil {
				err = fmt.Errorf("shard %s: %w", m.names[i], err)
				cancel()
			}
			errs <- err
		}()
	}
	var first error
	for range m.rs {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Pending is true while any shard's outbox may hold something unpublished.
func (m *shardRelays) Pending(ctx context.Context) (bool, error) {
	for i, r := range m.rs {
		p, err := r.Pending(ctx)
		if err != nil {
			return false, fmt.Errorf("shard %s: %w", m.names[i], err)
		}
		if p {
			return true, nil
		}
	}
	return false, nil
}

// Totals sums the shards' counters.
func (m *shardRelays) Totals() map[string]int64 {
	out := map[string]int64{}
	for _, r := range m.rs {
		for k, v := range r.Totals() {
			out[k] += v
		}
	}
	return out
}

// Ready is the first shard relay's refusal, naming its shard.
func (m *shardRelays) Ready(ctx context.Context) error {
	for i, r := range m.rs {
		if err := r.Ready(ctx); err != nil {
			return fmt.Errorf("shard %s: %w", m.names[i], err)
		}
	}
	return nil
}
