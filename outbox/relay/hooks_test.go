package relay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
)

// recorder implements every relay hook.
type recorder struct {
	mu        sync.Mutex
	published []Published
	parked    []Parked
	backlog   int
	// lastBacklog is the last BacklogMeasured event.
	lastBacklog BacklogMeasured
	leader      []bool
	rounds      []Round
}

func (h *recorder) OnRound(e Round) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.rounds = append(h.rounds, e)
}

func (h *recorder) OnPublished(e Published) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.published = append(h.published, e)
}
func (h *recorder) OnParked(e Parked) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.parked = append(h.parked, e)
}
func (h *recorder) OnBacklogMeasured(e BacklogMeasured) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.backlog++
	h.lastBacklog = e
}
func (h *recorder) OnLeadership(e Leadership) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.leader = append(h.leader, e.Leader)
}

type panicky struct{}

func (panicky) OnPublished(Published) { panic("hook bug") }

// The relay's hooks see each published and parked row with its ids, the leadership and the
// backlog; a panicking hook changes nothing; the counts agree with Stats.
func TestHooksSeePublishedAndParkedRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testenv.TopicWithConfig(t, b.brokers, 1, map[string]string{"max.message.bytes": "4000"})
	h := &recorder{}
	cfg := b.config(t)
	cfg.Hooks = []Hook{panicky{}, h}
	r, stop := b.start(t, cfg)
	ids := b.write(t,
		outbox.Record{Topic: topic, Key: []byte("a"), Value: []byte("a1")},
		outbox.Record{Topic: topic, Key: []byte("b"), Value: bytes.Repeat([]byte("x"), 8000)},
		outbox.Record{Topic: topic, Key: []byte("c"), Value: []byte("c1")})
	waitFor(t, 30*time.Second, "2 published, 1 parked", func() bool {
		st := b.states(t)
		return st[ids[0]] == "published" && st[ids[1]] == "parked" && st[ids[2]] == "published"
	})
	waitFor(t, 60*time.Second, "a backlog tick", func() bool { h.mu.Lock(); defer h.mu.Unlock(); return h.backlog > 0 })
	stop()
	oids := b.outboxIDs(t)
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.published) != 2 || len(h.parked) != 1 {
		t.Fatalf("published %+v parked %+v", h.published, h.parked)
	}
	for _, e := range h.published {
		if e.Topic != topic || e.Schema != b.schema || e.OutboxID != oids[e.RowID] || e.Latency <= 0 || (e.RowID != ids[0] && e.RowID != ids[2]) {
			t.Fatalf("odd Published %+v", e)
		}
	}
	if p := h.parked[0]; p.RowID != ids[1] || p.OutboxID != oids[ids[1]] || !strings.Contains(strings.ToLower(p.Error), "too large") {
		t.Fatalf("Parked %+v", p)
	}
	if s := r.Stats(); s.Published != 2 || s.Parked != 1 {
		t.Fatalf("Stats %+v", s)
	}
	if len(h.leader) != 2 || !h.leader[0] || h.leader[1] {
		t.Fatalf("leadership events %v, want [true false]", h.leader)
	}
	if h.backlog == 0 {
		t.Fatal("no BacklogMeasured event")
	}
	rows := 0
	for _, e := range h.rounds {
		if e.Schema != b.schema || e.Rows <= 0 || e.Produce <= 0 || e.Read <= 0 {
			t.Fatalf("odd Round %+v", e)
		}
		rows += e.Rows
	}
	if rows < 3 { // the parked row may have been produced twice (batched, then alone)
		t.Fatalf("rounds %+v produced %d rows, want at least the 3 written", h.rounds, rows)
	}
}

func TestNewRefusesAValueThatIsNoHook(t *testing.T) {
	pool, err := pgxpool.New(t.Context(), "postgres://nobody@127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	_, err = New(pool, &Config{Kafka: kafka.ConfigMap{"bootstrap.servers": "127.0.0.1:1"}, Hooks: []Hook{&recorder{}, 42}})
	if err == nil || !strings.Contains(err.Error(), "Config.Hooks[1] (int) implements none") {
		t.Fatalf("err = %v", err)
	}
}

// A mark with many rows to retry logs one line for them, not one a row (a round of rows
// produced one at a time after a batch-level refusal logged tens of thousands of lines); each
// row still gets its error stored and its HookPublishRetried event.
func TestRetriedRowsAreLoggedOnceAMark(t *testing.T) {
	t.Parallel()
	b := setup(t)
	core, logs := observer.New(zap.WarnLevel)
	h := &retryRecorder{}
	cfg := b.config(t)
	cfg.Logger = zap.New(core)
	cfg.Hooks = []Hook{h}
	r, err := New(b.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ids := b.write(t,
		outbox.Record{Topic: "t", Value: []byte("1")},
		outbox.Record{Topic: "t", Value: []byte("2")},
		outbox.Record{Topic: "t", Value: []byte("3")})
	rows := make([]row, len(ids))
	results := make([]result, len(ids))
	for i, id := range ids {
		rows[i] = row{id: id, topic: "t"}
		results[i] = result{outcome: outcomeRetry, err: errors.New("Broker: Message size too large")}
	}
	if err := r.mark(context.Background(), rows, results); err != nil {
		t.Fatal(err)
	}
	entries := logs.FilterMessageSnippet("will retry").All()
	if len(entries) != 1 || entries[0].ContextMap()["rows"] != int64(3) {
		t.Fatalf("retry log lines %+v, want one for 3 rows", entries)
	}
	if n := h.n.Load(); n != 3 {
		t.Fatalf("HookPublishRetried called %d times, want 3 (one a row)", n)
	}
	var withErr int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+b.t.Outbox+` WHERE attempts = 1 AND last_error LIKE '%too large%'`).Scan(&withErr); err != nil || withErr != 3 {
		t.Fatalf("%d rows with their error stored (%v), want 3", withErr, err)
	}
}

type retryRecorder struct{ n atomic.Int64 }

func (h *retryRecorder) OnPublishRetried(PublishRetried) { h.n.Add(1) }

// A standby measures the backlog too: with the leadership lock held by another session (a
// leader that publishes nothing, such as an older release that does not read packed rows),
// a relay standing by reports the records that wait, through its hooks (and so its gauges),
// and never leads. A fresh-eyes attack: a standby's gauges read 0 with 99,900 events waiting.
func TestAStandbyMeasuresTheBacklog(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	holder, err := b.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended($1, 0))`, LeadershipLockKey(b.schema)); err != nil {
		t.Fatal(err)
	}
	defer holder.Exec(context.Background(), `SELECT pg_advisory_unlock_all()`) //nolint:errcheck
	topic := testenv.Topic(t, b.brokers, 1)
	var recs []outbox.Record
	for i := range 7 {
		recs = append(recs, outbox.Record{Topic: topic, Key: []byte("k"), Value: []byte(fmt.Sprint(i))})
	}
	b.write(t, recs...)
	h := &recorder{}
	cfg := b.config(t)
	cfg.MetricsInterval = 100 * time.Millisecond
	cfg.Hooks = []Hook{h}
	_, stop := b.start(t, cfg)
	defer stop()
	testenv.WaitFor(t, 30*time.Second, "a BacklogMeasured event with the 7 records waiting", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.lastBacklog.Rows == 7
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.leader) != 0 {
		t.Fatalf("leadership events %v while another session holds the lock; want none", h.leader)
	}
}
