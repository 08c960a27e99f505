package engine

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/offsetstate"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
)

// Placement is where one partition's state lives: the shard's name and pool, and the
// directory's epoch of the mapping (Settings.Placer).
type Placement struct {
	Shard string
	Pool  *pgxpool.Pool
	Epoch int64
}

// Placer maps the partitions of an assignment to their shards: it is asked at every
// assignment, before anything of the partitions is read, and answers every partition it is
// given (or an error, and the assignment is reconciled again). Settings.Placer nil: every
// partition's state is on the pool New was given.
type Placer interface {
	Place(ctx context.Context, group string, tps []offsetstore.TP) (map[offsetstore.TP]Placement, error)
}

// shard is one database the loop's partitions live on: the unsharded loop has one (home),
// the pool New was given.
type shard struct {
	name string
	pool *pgxpool.Pool
	db   atomic.Pointer[offsetstate.Database] // its identity as last read (rollback.go)
}

// shardOf is the shard tp was placed on at its assignment (home without a Placer).
func (l *Loop) shardOf(tp offsetstore.TP) *shard {
	l.placeMu.Lock()
	defer l.placeMu.Unlock()
	if s := l.placed[tp]; s != nil {
		return s
	}
	return l.home
}

// poolOf is the pool of tp's shard.
func (l *Loop) poolOf(tp offsetstore.TP) *pgxpool.Pool { return l.shardOf(tp).pool }

// place maps tps to their shards (Settings.Placer) and records the mapping for the workers;
// it returns each shard with its partitions, in a stable order.
func (l *Loop) place(ctx context.Context, tps []offsetstore.TP) ([]*shard, map[*shard][]offsetstore.TP, error) {
	by := map[*shard][]offsetstore.TP{}
	var order []*shard
	add := func(s *shard, tp offsetstore.TP) {
		if _, ok := by[s]; !ok {
			order = append(order, s)
		}
		by[s] = append(by[s], tp)
	}
	if l.set.Placer == nil {
		for _, tp := range tps {
			add(l.home, tp)
		}
		return order, by, nil
	}
	ps, err := l.set.Placer.Place(ctx, l.group, tps)
	if err != nil {
		return nil, nil, fmt.Errorf("read the shard directory: %w", err)
	}
	l.placeMu.Lock()
	defer l.placeMu.Unlock()
	for _, tp := range tps {
		p, ok := ps[tp]
		if !ok || p.Pool == nil {
			return nil, nil, fmt.Errorf("the shard directory placed no shard for %s", tp)
		}
		s := l.shards[p.Pool]
		if s == nil {
			s = &shard{name: p.Shard, pool: p.Pool}
			l.shards[p.Pool] = s
		}
		l.placed[tp] = s
		add(s, tp)
	}
	return order, by, nil
}

// allShards is every shard the loop has placed a partition on, home first.
func (l *Loop) allShards() []*shard {
	l.placeMu.Lock()
	defer l.placeMu.Unlock()
	out := []*shard{l.home}
	for _, s := range l.shards {
		if s != l.home {
			out = append(out, s)
		}
	}
	return out
}

// beginOn opens a loop transaction (Settings.BeginSQL) on pool.
func (l *Loop) beginOn(pool *pgxpool.Pool) func(context.Context) (pgx.Tx, error) {
	return func(ctx context.Context) (pgx.Tx, error) {
		return pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: l.set.BeginSQL})
	}
}
