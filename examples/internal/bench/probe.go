package main

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx"
)

// headerProduced carries the time a message was handed to the producer, in Unix
// nanoseconds (decimal), on the messages whose latency is measured.
const headerProduced = "bench-produced-ns"

// commitProbe times messages at the moment their transaction's COMMIT returns. The handler
// tells it which messages the transaction on a connection holds (holding); as a pgx
// QueryTracer it sees that connection's COMMIT succeed and records, for every message, the
// time from its produce to that instant. A ROLLBACK, a failed COMMIT or a new BEGIN on the
// connection drops what it held, so a batch that is rolled back and re-run is counted once,
// when it finally commits. The Kafka offset commit that follows is not included: the
// database commit is the committed effect.
type commitProbe struct {
	mu   sync.Mutex
	open map[*pgx.Conn]*held
	lat  []time.Duration // produce -> commit, for messages with headerProduced

	committed atomic.Int64 // messages committed
	firstAt   atomic.Int64 // Unix ns of the first commit
	lastAt    atomic.Int64 // Unix ns of the latest commit
	firstN    atomic.Int64 // messages in the first commit
}

type held struct {
	n        int
	produced []int64
}

func newCommitProbe() *commitProbe { return &commitProbe{open: map[*pgx.Conn]*held{}} }

var _ pgx.QueryTracer = (*commitProbe)(nil)

// holding records that the open transaction on conn holds msgs.
func (p *commitProbe) holding(conn *pgx.Conn, msgs []*kafkatx.Message) {
	var produced []int64
	for _, m := range msgs {
		if v, ok := m.Header(headerProduced); ok {
			if ns, err := strconv.ParseInt(string(v), 10, 64); err == nil {
				produced = append(produced, ns)
			}
		}
	}
	p.mu.Lock()
	h := p.open[conn]
	if h == nil {
		h = &held{}
		p.open[conn] = h
	}
	h.n += len(msgs)
	h.produced = append(h.produced, produced...)
	p.mu.Unlock()
}

type txVerb int

const (
	verbOther txVerb = iota
	verbBegin
	verbCommit
	verbRollback
)

type verbKey struct{}

func verbOf(sql string) txVerb {
	switch sql {
	case "begin":
		return verbBegin
	case "commit":
		return verbCommit
	case "rollback":
		return verbRollback
	}
	return verbOther
}

// TraceQueryStart notes whether the statement ends or starts a transaction (pgx sends
// "begin", "commit" and "rollback" for pgx.Tx).
func (p *commitProbe) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if v := verbOf(data.SQL); v != verbOther {
		return context.WithValue(ctx, verbKey{}, v)
	}
	return ctx
}

// TraceQueryEnd records the held messages when a COMMIT succeeded and drops them when the
// transaction ended any other way.
func (p *commitProbe) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	v, _ := ctx.Value(verbKey{}).(txVerb)
	if v == verbOther {
		return
	}
	now := time.Now()
	p.mu.Lock()
	h := p.open[conn]
	delete(p.open, conn)
	if h == nil || v != verbCommit || data.Err != nil || data.CommandTag.String() != "COMMIT" {
		p.mu.Unlock()
		return
	}
	for _, ns := range h.produced {
		p.lat = append(p.lat, now.Sub(time.Unix(0, ns)))
	}
	p.mu.Unlock()
	if p.firstAt.CompareAndSwap(0, now.UnixNano()) {
		p.firstN.Store(int64(h.n))
	}
	p.lastAt.Store(now.UnixNano())
	p.committed.Add(int64(h.n))
}

// take returns the latencies recorded since the last take (or since the start), sorted, and
// forgets them: the soak's per-window figures, with the probe's memory bounded by one window.
func (p *commitProbe) take() []time.Duration {
	p.mu.Lock()
	out := p.lat
	p.lat = nil
	p.mu.Unlock()
	slices.Sort(out)
	return out
}

// latencies returns the recorded produce -> commit latencies, sorted.
func (p *commitProbe) latencies() []time.Duration {
	p.mu.Lock()
	out := slices.Clone(p.lat)
	p.mu.Unlock()
	slices.Sort(out)
	return out
}

// quantile is the nearest-rank q-quantile of sorted, in milliseconds; 0 when empty.
func quantile(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*q+0.999999) - 1
	i = max(0, min(i, len(sorted)-1))
	return float64(sorted[i].Microseconds()) / 1000
}
