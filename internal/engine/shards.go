package engine

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"

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

// FirstRunConfirmer is a Placer that confirms a partition's placement in the transaction that
// records its first watermark on its shard, before the row is written: it serializes with a
// shard move on that shard (a lock both take) and checks that the directory still maps the
// partition there at the epoch it was placed with. A move of a partition that has no watermark
// yet finds nothing to copy on the shard it leaves; without this check the partition's first
// run could start there after the move and be applied on the shard the directory no longer
// names. An error rolls the first run back and the assignment is reconciled again (the
// partition placed anew).
type FirstRunConfirmer interface {
	ConfirmFirstRun(ctx context.Context, tx pgx.Tx, group string, tp offsetstore.TP, p Placement) error
}

// confirmFirstRun is FirstRunConfirmer's check for tp when the loop has a Placer that
// implements it; nil otherwise.
func (l *Loop) confirmFirstRun(ctx context.Context, tx pgx.Tx, tp offsetstore.TP) error {
	c, ok := l.set.Placer.(FirstRunConfirmer)
	if !ok {
		return nil
	}
	l.placeMu.Lock()
	p, ok := l.placements[tp]
	l.placeMu.Unlock()
	if !ok {
		return nil
	}
	return c.ConfirmFirstRun(ctx, tx, l.group, tp, p)
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
		l.placements[tp] = p
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

// replace asks the poll loop to place the worker's partition again (Loop.replace): its
// watermark row is gone from its shard because a shard move took the partition's state
// elsewhere. The worker returns after asking; its in-flight transaction was fenced.
func (p *worker) replace() {
	p.log.Warn("the partition's watermark left its shard (a shard move): re-reading the shard directory and continuing on the partition's new shard")
	select {
	case p.resyncs <- resyncRequest{p: p, done: make(chan struct{}), replace: true}:
	case <-p.stopCh:
	}
}

// replace runs on the poll loop's goroutine: it drops what the poll loop holds for p's
// partition, reconciles the partition again (the directory read anew, the watermark read on
// its new shard, a new worker started) and seeks the client there. A directory or shard that
// does not answer is retried for replaceWithin, then the consumer stops with the error.
func (l *Loop) replace(p *worker) {
	f := l.parts[p.tp]
	if f == nil || f.w != p {
		return
	}
	for _, m := range f.pending {
		p.bytes.Add(-messageBytes(m))
	}
	f.pending = nil
	f.pendingLen.Store(0)
	p.requestStop(true) // its lanes are fenced too: their state is gone from this shard
	deadline := time.Now().Add(replaceWithin)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), replaceWithin)
		starts, err := l.reconcile(ctx, []kafka.TopicPartition{p.ktp()})
		cancel()
		if err == nil {
			if _, err := l.kc.SeekPartitions(starts); err != nil {
				l.log.Warn("seek after a shard move", zap.String("topic", p.tp.Topic), zap.Int32("partition", p.tp.Partition), zap.Error(err))
			}
			if f.paused {
				_ = l.kc.Resume([]kafka.TopicPartition{p.ktp()})
			}
			l.log.Info("partition continues on its new shard", zap.String("topic", p.tp.Topic), zap.Int32("partition", p.tp.Partition),
				zap.String("shard", l.shardOf(p.tp).name), zap.Strings("start", tpOffsets(starts)))
			return
		}
		if time.Now().After(deadline) {
			l.fail(fmt.Errorf("partition %s: place it after a shard move: %w", p.tp, err))
			return
		}
		l.log.Warn("place the partition after a shard move; retrying", zap.String("topic", p.tp.Topic), zap.Int32("partition", p.tp.Partition), zap.Error(err))
		time.Sleep(500 * time.Millisecond)
	}
}

// replaceWithin bounds Loop.replace's retries.
const replaceWithin = 30 * time.Second
