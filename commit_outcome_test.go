package kafkatx

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// cutProxy forwards TCP connections to target; cut closes the client side of every
// connection open now and leaves the server side open — a network cut the server does not
// notice, so its backend goes on (a COMMIT waiting for a standby keeps waiting).
type cutProxy struct {
	ln      net.Listener
	target  string
	mu      sync.Mutex
	clients []net.Conn
	servers []net.Conn
	wg      sync.WaitGroup
	down    atomic.Bool // new connections are refused (pgx's cancel request cannot get through)
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if p.down.Load() {
				c.Close()
				continue
			}
			p.mu.Lock()
			to := p.target
			p.mu.Unlock()
			s, err := net.Dial("tcp", to)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.clients, p.servers = append(p.clients, c), append(p.servers, s)
			p.mu.Unlock()
			p.wg.Add(2)
			go func() { defer p.wg.Done(); _, _ = io.Copy(s, c) }() // the server side stays open after a cut
			go func() { defer p.wg.Done(); _, _ = io.Copy(c, s); c.Close() }()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		p.cut()
		p.mu.Lock()
		for _, s := range p.servers {
			s.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// retarget sends the connections accepted from now on to target (a promoted standby).
func (p *cutProxy) retarget(target string) {
	p.mu.Lock()
	p.target = target
	p.mu.Unlock()
}

func (p *cutProxy) cut() {
	p.down.Store(true)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.clients {
		c.Close()
	}
	p.clients = nil
}

// TestLostCommitAnswerIsSettledFromTheDatabasesRecord: on a PostgreSQL of the test's own,
// synchronous_standby_names names a standby that does not exist, so a COMMIT waits; its
// connection is then cut, so the loop never gets the answer, and while the commit waits its
// transaction reads as in progress. The loop settles the outcome from txid_status before
// anything else: it waits while in progress, and once the wait is released (the setting
// reset) it reads committed and goes on — the handler is not run again, nothing is counted as
// an attempt, nothing dead-lettered, nothing fenced, every message applied once.
func TestLostCommitAnswerIsSettledFromTheDatabasesRecord(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 4} {
		t.Run(fmt.Sprintf("Concurrency %d", n), func(t *testing.T) { lostCommitAnswer(t, n) })
	}
}

func lostCommitAnswer(t *testing.T, concurrency int) {
	own := testenv.StartOwnPostgres(t, "synchronous_commit = on")
	ctx := context.Background()
	admin, err := pgxpool.New(ctx, own.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	proxy := newCutProxy(t, admin.Config().ConnConfig.Host+":"+strconv.Itoa(int(admin.Config().ConnConfig.Port)))
	viaProxy := fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", proxy.ln.Addr())
	pool, err := pgxpool.New(ctx, viaProxy)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	b := &testBundle{pool: pool, dbURL: viaProxy, schema: "kafkatx", brokers: testenv.Brokers(t)}
	b.topic = testenv.Topic(t, b.brokers, 1)
	b.group = "g-" + b.topic
	b.migrateWithEffects(t)
	produce(t, b.brokers, b.topic, values(4, 0, func(i int) string { return fmt.Sprint(i) }))
	var calls [5]atomic.Int32
	release := make(chan struct{})
	var fenced atomic.Int32
	cfg := b.config(t)
	cfg.Hooks = []Hook{fenceCounter{&fenced}}
	cfg.Batch.Size = 1 // offset 3 in a transaction of its own
	cfg.Concurrency = concurrency
	r := b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		calls[m.Offset].Add(1)
		if m.Offset == 3 {
			select { // its COMMIT is to come after the standby is required
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return applyEffect(ctx, tx, b.schema, m)
	}, cfg)
	waitFor(t, 60*time.Second, "the first messages applied and offset 3's handler running", func() bool {
		return b.q(t, "SELECT count(*) FROM kafkatx.effects") == 3 && calls[3].Load() == 1
	})
	// From now on a COMMIT waits for a standby that does not exist.
	for _, sql := range []string{"ALTER SYSTEM SET synchronous_standby_names = 'missing_standby'", "SELECT pg_reload_conf()"} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second)
	close(release)
	var waiter int
	waitFor(t, 30*time.Second, "a COMMIT waiting for the standby", func() bool {
		return admin.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep' LIMIT 1`).Scan(&waiter) == nil
	})
	// The network goes down: the loop loses the COMMIT's answer, and pgx's cancel request
	// cannot reach the server, which goes on waiting for the standby.
	proxy.cut()
	time.Sleep(time.Second)
	proxy.down.Store(false) // back: the commit still waits, its transaction reads as in progress
	time.Sleep(2 * time.Second)
	var st, we string
	if err := admin.QueryRow(ctx, `SELECT coalesce(state, ''), coalesce(wait_event, '') FROM pg_stat_activity WHERE pid = $1`, waiter).Scan(&st, &we); err != nil || we != "SyncRep" {
		t.Fatalf("the COMMIT no longer waits (%q %q %v): the test lost its unknown outcome", st, we, err)
	}
	if n := calls[3].Load(); n != 1 {
		t.Fatalf("the handler of offset 3 ran %d times while its COMMIT's outcome was unknown; want 1 (settle first, run nothing again)", n)
	}
	// Release the wait: the transaction commits.
	for _, sql := range []string{"ALTER SYSTEM RESET synchronous_standby_names", "SELECT pg_reload_conf()"} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 30*time.Second, "the watermark past offset 3", func() bool {
		return b.q(t, "SELECT coalesce(max(next_offset), 0) FROM kafkatx.watermarks") == 4
	})
	produce(t, b.brokers, b.topic, values(1, 0, func(int) string { return "4" }))
	waitFor(t, 30*time.Second, "the next message applied", func() bool { return b.q(t, "SELECT count(*) FROM kafkatx.effects") == 5 })
	if n := b.q(t, "SELECT count(*) FROM kafkatx.effects WHERE applied <> 1") + b.q(t, "SELECT count(*) FROM kafkatx.attempts") +
		b.q(t, "SELECT count(*) FROM kafkatx.dead_letters"); n != 0 {
		t.Fatalf("%d effects applied twice, attempt rows or dead letters", n)
	}
	if calls[3].Load() != 1 || fenced.Load() != 0 {
		t.Fatalf("offset 3's handler ran %d times, %d fences; want 1 and 0", calls[3].Load(), fenced.Load())
	}
	_ = r
}

type fenceCounter struct{ n *atomic.Int32 }

func (f fenceCounter) OnFenced(Fenced) { f.n.Add(1) }
