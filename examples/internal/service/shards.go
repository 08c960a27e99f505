package service

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/outbox"
	"github.com/kafkatx/kafkatx/outbox/relays"
	"github.com/kafkatx/kafkatx/shards"
)

// ShardFlags is --shard NAME=URL, repeated (flag.Value): the shards of a sharded service, in
// order (the first takes the partitions the directory does not map yet). Set only collects
// the values: the flag package quotes a refused value in its error, and a URL may hold a
// password. Check parses them (shards.ParseSpecs), after the flags are parsed.
type ShardFlags []string

// String lists the shards' names (never their URLs, which may hold a password).
func (s *ShardFlags) String() string {
	var names []string
	for _, v := range *s {
		name, _, _ := strings.Cut(v, "=")
		names = append(names, name)
	}
	return strings.Join(names, ",")
}

// Set appends one NAME=URL; Check refuses a bad one.
func (s *ShardFlags) Set(v string) error {
	*s = append(*s, v)
	return nil
}

// Check returns shards.ParseSpecs' refusal of the --shard values (a missing '=', a bad or
// repeated name, a URL that does not parse: never quoting the URL), or nil.
func (s ShardFlags) Check() error {
	_, err := shards.ParseSpecs(s)
	return err
}

// Open opens a pool on every shard (shards.Open) — a shard whose URL is dirURL shares dir, the
// directory's pool — with at least DefaultMaxConns connections each (the shard's connection
// budget in this process: pool_max_conns in its URL sets it), and returns the set; nil
// without --shard. Set.Close closes what it opened.
func (s ShardFlags) Open(ctx context.Context, dir *pgxpool.Pool, dirURL string) (*shards.Set, error) {
	specs, err := shards.ParseSpecs(s)
	if err != nil {
		return nil, err
	}
	return shards.Open(ctx, specs, shards.OpenOptions{Directory: dir, DirectoryURL: dirURL, MinConns: DefaultMaxConns})
}

// shardRelays runs one relay per shard, each on its shard's pool in the shard's stored outbox
// mode, with its own leadership (table mode: the lock on that database; WAL mode: the shard's
// slot) and retention, its metrics labelled shard=NAME: one relays.Relay to Run.
type shardRelays struct {
	names []string
	rs    []relays.Relay
}

// newShardRelays builds the shards' relays. A WAL shard's relay streams from the slot its
// schema records (outbox.SlotName of the shard's database and schema, at SetMode) and writes its
// checkpoint under the shard's system identifier, database and slot; its transactional.id is
// "kafkatx-wal-<shard>-<slot>" (the prefix with the shard's name), because two shards on two
// clusters whose database and schema are named alike have the same slot name, and one
// transactional.id would make their relays fence each other's Kafka transactions.
func newShardRelays(ctx context.Context, set *shards.Set, ro relays.Options, reg prometheus.Registerer) (*shardRelays, error) {
	out := &shardRelays{}
	for _, sh := range set.Shards {
		st, err := outbox.ReadSettings(ctx, sh.Pool, ro.Schema)
		if err != nil {
			return nil, fmt.Errorf("shard %s: %w", sh.Name, err)
		}
		o := ro
		o.Mode = st.Mode
		o.Session = nil // the shard's own pool's configuration
		o.Logger = ro.Logger.With(zap.String("shard", sh.Name))
		if o.Mode == outbox.ModeWAL {
			prefix := ro.WAL.TransactionalIDPrefix
			if prefix == "" {
				prefix = "kafkatx-wal-"
			}
			o.WAL.TransactionalIDPrefix = prefix + sh.Name + "-"
		}
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
