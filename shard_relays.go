package kafkatx

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/outbox/leading"
	"github.com/kafkatx/kafkatx/shards"
)

// ShardUnrelayedAfter is how long a shard's outbox may wait with no relay leading that shard
// (leading.Of: in table mode no session holds the relay's leadership lock there and rows
// wait; in WAL mode the shard's slot is not active and its confirmed position is behind the
// current WAL, leading.WAL) before the
// consumer calls the shard relayed by nobody: the gauge kafkatx_shard_relay_unowned{shard}
// goes to 1 and Readiness.Notes names the shard. One minute: a standby relay takes over
// within its StandbyInterval, and a relay restarting comes back within seconds.
const ShardUnrelayedAfter = time.Minute

// shardRelayPoll is how often the consumer reads each shard's relay leadership (one query a
// shard).
const shardRelayPoll = 15 * time.Second

// shardRelays watches, for a consumer with Config.Shards, whether each shard's outbox has a
// relay (its leader also runs the shard's retention). It only reports: a relay is a process
// of its own (a sidecar `kafkatx relay` per shard, or one in-process relay per shard).
type shardRelays struct {
	set    *shards.Set
	schema string
	after  time.Duration
	gauge  *prometheus.GaugeVec // nil: none
	log    *zap.Logger

	mu    sync.Mutex
	since map[string]time.Time // shard -> rows waiting with no leader since (absent: led, or nothing waits)
	err   map[string]string    // shard -> why the last look failed
}

func newShardRelays(set *shards.Set, schema string, gauge *prometheus.GaugeVec, log *zap.Logger) *shardRelays {
	return &shardRelays{set: set, schema: schema, after: ShardUnrelayedAfter, gauge: gauge, log: log,
		since: map[string]time.Time{}, err: map[string]string{}}
}

// check looks at every shard once, at now. A shard that cannot be read keeps its last state
// (its error is noted): the consumer's own readiness covers an unreachable database.
func (w *shardRelays) check(ctx context.Context, now time.Time) {
	for _, sh := range w.set.Shards {
		leader, pending, err := leading.Of(ctx, sh.Pool, w.schema)
		w.mu.Lock()
		if err != nil {
			w.err[sh.Name] = err.Error()
			w.mu.Unlock()
			continue
		}
		delete(w.err, sh.Name)
		since, waiting := w.since[sh.Name]
		switch {
		case leader || !pending:
			delete(w.since, sh.Name)
		case !waiting:
			w.since[sh.Name] = now
			since = now
		}
		unowned := !leader && pending && now.Sub(since) >= w.after
		w.mu.Unlock()
		if w.gauge != nil {
			v := 0.0
			if unowned {
				v = 1
			}
			w.gauge.WithLabelValues(sh.Name).Set(v)
		}
		if unowned && now.Sub(since) < w.after+shardRelayPoll {
			w.log.Warn("a shard's outbox rows wait and no relay leads it: start a relay for the shard (the relay command or an in-process relay, on the shard's URL)",
				zap.String("shard", sh.Name), zap.Time("since", since))
		}
	}
}

// run checks every shardRelayPoll until ctx ends.
func (w *shardRelays) run(ctx context.Context) {
	t := time.NewTicker(shardRelayPoll)
	defer t.Stop()
	for {
		w.check(ctx, time.Now())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// note is the readiness note (AddReadinessNote): the shards relayed by nobody for at least
// after, in Config.Shards order, "" when none.
func (w *shardRelays) note(context.Context) string { return w.noteAt(time.Now()) }

func (w *shardRelays) noteAt(now time.Time) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, sh := range w.set.Shards {
		if since, ok := w.since[sh.Name]; ok && now.Sub(since) >= w.after {
			out = append(out, fmt.Sprintf("shard %s: outbox rows have waited since %s with no relay leading the shard (nothing publishes them and its retention does not run): run a relay for it",
				sh.Name, since.UTC().Format(time.RFC3339)))
		}
	}
	return strings.Join(out, "; ")
}
