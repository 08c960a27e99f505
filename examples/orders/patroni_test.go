package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
)

// The Patroni cluster of scripts/dev-services up patroni (two PostgreSQL 15 nodes, one etcd).
type patroni struct {
	url  string   // both nodes, target_session_attrs=read-write
	rest []string // node1's and node2's REST APIs
	dir  string   // node1/ and node2/: data/, patroni.pid
	ctl  string   // patronictl's configuration
	repo string
}

func patroniCluster(t *testing.T) *patroni {
	t.Helper()
	testenv.FullTier(t, "needs a Patroni cluster (scripts/dev-services up patroni)")
	p := &patroni{url: os.Getenv("PATRONI_DATABASE_URL"), dir: os.Getenv("PATRONI_DIR"), ctl: os.Getenv("PATRONICTL_CONFIG_FILE")}
	if p.url == "" || p.dir == "" || p.ctl == "" || os.Getenv("PATRONI_REST_URLS") == "" {
		testenv.Unavailable(t, "PATRONI_DATABASE_URL, PATRONI_REST_URLS, PATRONI_DIR or PATRONICTL_CONFIG_FILE is not set (scripts/dev-services up patroni)")
	}
	p.rest = strings.Split(os.Getenv("PATRONI_REST_URLS"), ",")
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	p.repo = root
	if _, err := p.leader(); err != nil {
		testenv.Unavailable(t, "the Patroni cluster has no leader: %v", err)
	}
	return p
}

func restOK(u string) bool {
	c := http.Client{Timeout: 2 * time.Second}
	r, err := c.Get(u)
	if err != nil {
		return false
	}
	r.Body.Close()
	return r.StatusCode == http.StatusOK
}

// leader returns the index (0: node1) of the node answering GET /primary.
func (p *patroni) leader() (int, error) {
	for i, r := range p.rest {
		if restOK(r + "/primary") {
			return i, nil
		}
	}
	return -1, fmt.Errorf("no node answers GET /primary")
}

func (p *patroni) nodeDir(i int) string { return filepath.Join(p.dir, fmt.Sprintf("node%d", i+1)) }

func (p *patroni) pids(t *testing.T, i int) (patroniPID, postmasterPID int) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(p.nodeDir(i), "patroni.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pm, err := os.ReadFile(filepath.Join(p.nodeDir(i), "data", "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	m, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(pm), "\n", 2)[0]))
	if a <= 0 || m <= 0 {
		t.Fatalf("node%d: pids %q %q", i+1, b, pm)
	}
	return a, m
}

// ctlEdit changes the cluster's dynamic configuration (patronictl edit-config -s).
func (p *patroni) ctlEdit(t *testing.T, sets ...string) {
	t.Helper()
	args := []string{"-c", p.ctl, "edit-config", "--force"}
	for _, s := range sets {
		args = append(args, "-s", s)
	}
	if out, err := exec.Command("patronictl", args...).CombinedOutput(); err != nil {
		t.Fatalf("patronictl %v: %v\n%s", args, err, out)
	}
}

// up brings back a node a test killed (it rejoins as a replica) and waits for streaming.
func (p *patroni) up(t *testing.T, mode string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(p.repo, "scripts", "dev-services"), "up", "patroni")
	cmd.Env = append(os.Environ(), "PATRONI_SYNCHRONOUS_MODE="+strconv.FormatBool(mode == "sync"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("scripts/dev-services up patroni: %v\n%s", err, out)
	}
}

func dbURL(t *testing.T, base, db string) string {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + db
	return u.String()
}

func nodeURL(t *testing.T, base string, i int) string {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = strings.Split(u.Host, ",")[i]
	q := u.Query()
	q.Del("target_session_attrs")
	q.Del("pool_max_conns")
	q.Set("connect_timeout", "2")
	u.RawQuery = q.Encode()
	return u.String()
}

func queryInt(ctx context.Context, dsn, sql string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return 0, err
	}
	defer c.Close(context.Background())
	var n int64
	err = c.QueryRow(ctx, sql).Scan(&n)
	return n, err
}

// A failover of the Patroni cluster under load, in both outbox modes and both replication
// modes, with the order service reaching the cluster through the multi-host URL
// (target_session_attrs=read-write) and a supervisor restarting it whenever it exits
// non-zero (systemd's Restart=on-failure): every order applied exactly once on the new
// primary, the dead letters exactly the pills, no skip row in the offset audit, every
// order's event present under one kafkatx-outbox-id that no other order carries.
//
// Mid-drain the leader's walsender to the replica is stopped (SIGSTOP) for 2 s, then the
// leader's Patroni, postmaster and that walsender are SIGKILLed: asynchronously the leader
// committed what the replica never got (lost commits, re-processed by the consumer from the
// new primary's watermark); synchronously the leader's commits waited for the standby, so the
// promoted node has every commit that was visible. (Stopping the replica's WAL receiver
// instead loses nothing: the WAL waits in its socket's buffer.) Figures are logged
// (docs/deployment.md).
//
// The consumer side (a Kafka offset ahead of the watermark that kafkatx committed is a
// rollback, the re-seek when the watermark falls below the position, lost COMMIT answers
// settled on the new primary, event ids derived from the input) is issue 32's other half;
// without it the asynchronous subtests fail on the lost orders or on split ids.
func TestPatroniFailoverUnderLoadLosesNothing(t *testing.T) {
	p := patroniCluster(t)
	bin := buildOrders(t)
	brokers := testenv.Brokers(t)
	for _, mode := range []string{"async", "sync"} {
		for _, ob := range []outbox.Mode{outbox.ModeTable, outbox.ModeWAL} {
			t.Run(mode+"/"+string(ob), func(t *testing.T) { failoverUnderLoad(t, p, bin, brokers, mode, ob) })
		}
	}
}

func failoverUnderLoad(t *testing.T, p *patroni, bin, brokers, mode string, ob outbox.Mode) {
	ctx := context.Background()
	p.up(t, mode) // both nodes streaming, synchronous_mode as asked

	db := testenv.UniqueName(t, "ha", 40)
	if _, err := queryInt(ctx, p.url, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, p.url)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	admin.Close(ctx)
	dsn := dbURL(t, p.url, db) + "&pool_max_conns=12"
	// Until the replica has replayed CREATE DATABASE, pgx stops at it: a server's "database
	// does not exist" (3D000) ends the multi-host attempt instead of trying the next host.
	for i, deadline := 0, time.Now().Add(60*time.Second); i < 2; {
		if _, err := queryInt(ctx, nodeURL(t, dsn, i), "SELECT 1"); err == nil {
			i++
		} else if time.Now().After(deadline) {
			t.Fatalf("database %s not on node%d within 60 s: %v", db, i+1, err)
		} else {
			time.Sleep(200 * time.Millisecond)
		}
	}
	slot := outbox.SlotName(db, "kafkatx")
	t.Cleanup(func() {
		if ob == outbox.ModeWAL {
			p.ctlEdit(t, "slots."+slot+"=null")
		}
		for i := 0; i < 100; i++ {
			c, err := pgx.Connect(ctx, p.url)
			if err == nil {
				_, _ = c.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1 AND NOT active`, db)
				_, err = c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)")
				c.Close(ctx)
				if err == nil {
					return
				}
			}
			time.Sleep(200 * time.Millisecond)
		}
	})
	if ob == outbox.ModeWAL {
		// kafkatx migrate up --outbox-mode wal (the publication, then the slot), then the slot
		// made a Patroni permanent slot: copied to the replica and advanced there, so the WAL
		// relay finds it on the promoted node. (Declared before the publication existed, the
		// slot would fail on the changes in between: pgoutput looks the publication up as of
		// each change.)
		pool, err := pgxpool.New(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := migrations.Apply(ctx, pool, "kafkatx"); err != nil {
			t.Fatal(err)
		}
		if err := outbox.SetMode(ctx, pool, "kafkatx", outbox.ModeWAL); err != nil {
			t.Fatal(err)
		}
		pool.Close()
		p.ctlEdit(t, "slots."+slot+".type=logical", "slots."+slot+".database="+db, "slots."+slot+".plugin=pgoutput")
		// Wait until both nodes hold the slot (the replica restarts its PostgreSQL once to copy it).
		deadline := time.Now().Add(90 * time.Second)
		for i := 0; i < 2; i++ {
			for {
				n, err := queryInt(ctx, nodeURL(t, p.url, i), "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '"+slot+"'")
				if err == nil && n == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the permanent slot %s is not on node%d within 90 s (%v)", slot, i+1, err)
				}
				time.Sleep(300 * time.Millisecond)
			}
		}
		p.up(t, mode)
	}

	topic := testenv.Topic(t, brokers, 3)
	events := testenv.Topic(t, brokers, 3)
	testenv.NamedTopic(t, brokers, topic+".dlq", 3, nil)
	args := []string{"--brokers", brokers, "--database-url", dsn, "--topic", topic, "--group", testenv.Group(t), "--events-topic", events}
	// Orders arrive in chunks of 2,000 (one poison pill each): two before the service starts,
	// then one a second until 3 s after the promotion, then one more.
	const chunk = 2000
	ch := newChunks(t, bin, args, chunk)
	ch.produce()
	ch.produce()
	ch.everySecond()

	// The service under a supervisor: restarted 1 s after a non-zero exit; done at exit 0.
	sv := supervise(t, bin, append(args, "--outbox-mode", string(ob), "--batch-size", "200", "--exit-when-idle", "6s"))

	leader, err := p.leader()
	if err != nil {
		t.Fatal(err)
	}
	replica := 1 - leader
	applied := func(i int) (int64, error) {
		return queryInt(ctx, nodeURL(t, dsn, i), "SELECT coalesce(sum(orders), 0)::bigint FROM customer_totals")
	}
	for deadline := time.Now().Add(120 * time.Second); ; {
		n, _ := applied(leader)
		if n >= chunk {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the drain did not reach %d orders on the leader within 120 s (%d)\n%s", chunk, n, sv.detail())
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Synchronously, Patroni promotes only the node its /sync key names: a replica that
	// restarted (the permanent slot's copy restarts it) is named again a loop or two after it
	// streams, and a leader killed before that leaves no node it may promote. The replica
	// must be the synchronous standby before the partition (GET /synchronous answers 200).
	// And it must stay so for four of Patroni's loops (loop_wait 2 s): a replica named while
	// it still copies the leader's logical slots may be dropped from /sync a loop later
	// ("Updating synchronous privilege temporarily"), and a leader killed then leaves no node
	// it may promote (CI: named at 17:35:43, dropped at :45, leader killed at :49, no promotion).
	if mode == "sync" {
		var since time.Time
		for deadline := time.Now().Add(90 * time.Second); since.IsZero() || time.Since(since) < 8*time.Second; {
			if restOK(p.rest[replica] + "/synchronous") {
				if since.IsZero() {
					since = time.Now()
				}
			} else {
				since = time.Time{}
			}
			if time.Now().After(deadline) {
				t.Fatalf("node%d is not the synchronous standby for 8 s in a row within 90 s", replica+1)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}

	// The partition: the leader's walsender to the replica stops for 2 s while the leader
	// commits (what it has not sent is lost with the leader), then the leader dies.
	lp, lpm := p.pids(t, leader)
	out, _ := exec.Command("pgrep", "-P", strconv.Itoa(lpm), "-f", "walsender replicator").Output()
	walsnd, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0]))
	if walsnd <= 0 {
		t.Fatalf("no walsender for the replica under the leader's postmaster %d", lpm)
	}
	_ = syscall.Kill(walsnd, syscall.SIGSTOP)
	time.Sleep(2 * time.Second)
	lastOnLeader, _ := applied(leader)
	_ = syscall.Kill(lp, syscall.SIGKILL)
	_ = syscall.Kill(lpm, syscall.SIGKILL)
	_ = syscall.Kill(walsnd, syscall.SIGKILL) // stopped, it would not notice its postmaster's death
	killed := time.Now()

	// Promotion: the replica answers GET /primary.
	for !restOK(p.rest[replica] + "/primary") {
		if time.Since(killed) > 90*time.Second {
			t.Fatalf("node%d was not promoted within 90 s of the leader's kill", replica+1)
		}
		time.Sleep(50 * time.Millisecond)
	}
	promoted := time.Now()
	atPromotion, err := applied(replica)
	if err != nil {
		t.Fatalf("read the promoted node: %v", err)
	}
	var firstApplied time.Duration
	for {
		if n, err := applied(replica); err == nil && n > atPromotion {
			firstApplied = time.Since(promoted)
			break
		}
		if sv.exited() {
			t.Fatalf("the service exited 0 (idle) without applying anything on the promoted node\n%s", sv.detail())
		}
		if time.Since(promoted) > 120*time.Second {
			t.Fatalf("nothing applied on the promoted node within 120 s\n%s", sv.detail())
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(3*time.Second - time.Since(promoted))
	ch.stop()
	ch.produce()  // new traffic after the failover
	p.up(t, mode) // the old leader rejoins as a replica (pg_rewind)

	select {
	case <-sv.done:
	case <-time.After(240 * time.Second):
		t.Fatalf("the service did not drain within 240 s of the failover\n%s", sv.detail())
	}

	// The counts, on the new primary.
	pills := ch.count()
	valid := int64(pills * (chunk - 1))
	newPrimary := nodeURL(t, dsn, replica)
	orders, err := queryInt(ctx, newPrimary, "SELECT count(*) FROM order_totals")
	if err != nil {
		t.Fatal(err)
	}
	sum, _ := applied(replica)
	dl, _ := queryInt(ctx, newPrimary, "SELECT count(*) FROM kafkatx.dead_letters")
	skips, _ := queryInt(ctx, newPrimary, "SELECT count(*) FROM kafkatx.offset_audit WHERE kind IN ('unexplained_skip', 'operator_skip')")
	ids := readEventIDs(t, brokers, events)
	var dbOrders = map[string]bool{}
	{
		c, err := pgx.Connect(ctx, newPrimary)
		if err != nil {
			t.Fatal(err)
		}
		rows, _ := c.Query(ctx, "SELECT order_id::text FROM order_totals")
		for rows.Next() {
			var o string
			_ = rows.Scan(&o)
			dbOrders[o] = true
		}
		rows.Close()
		c.Close(ctx)
	}
	ev := tallyEvents(ids, dbOrders)
	lost := lastOnLeader - atPromotion
	// The WAL relay's line when its checkpoint was past the old timeline's end (outbox/walrelay).
	pastEnd := strings.Count(sv.logs.String(), "failover: the checkpoint covers transactions of an older timeline")
	t.Logf("%s replication, %s outbox: commits lost by the failover (orders on the leader at the kill - on the promoted node) %d; "+
		"promotion %.1f s after the kill; first applied order %.2f s after promotion; service restarts %d; "+
		"copies of an event id %d; ghosts (orders with an event of a lost transaction besides their own: more than one id) %d; "+
		"events of orders the database lacks %d; WAL relay checkpoints past the old timeline's end %d",
		mode, ob, lost, promoted.Sub(killed).Seconds(), firstApplied.Seconds(), sv.restarts.Load(), ev.copies, ev.split, ev.ghosts, pastEnd)
	if mode == "sync" && lost > 0 {
		t.Errorf("synchronous_mode: the promoted node lacks %d orders that were visible on the leader", lost)
	}
	if orders != valid || sum != valid || dl != int64(pills) {
		t.Errorf("the new primary holds %d order rows, customer count %d, %d dead letters; want %d, %d, %d (lost by the failover: %d)",
			orders, sum, dl, valid, valid, pills, lost)
	}
	if skips != 0 {
		t.Errorf("%d skip rows in the offset audit", skips)
	}
	if ev.missing != 0 || ev.shared != 0 {
		t.Errorf("%d orders without an event, %d event ids carried by two orders", ev.missing, ev.shared)
	}
	if ev.split != 0 || ev.ghosts != 0 {
		t.Errorf("%d orders whose events carry more than one kafkatx-outbox-id, %d ghost events (orders the database lacks)", ev.split, ev.ghosts)
	}
	if t.Failed() {
		t.Logf("service log:\n%s", sv.detail())
	}
}

// readEventIDs reads topic to its end (read_committed) and returns, per order id, how many
// times each kafkatx-outbox-id was seen.
func readEventIDs(t *testing.T, brokers, topic string) map[string]map[string]int {
	t.Helper()
	c, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": brokers, "group.id": "ha-reader-" + topic,
		"auto.offset.reset": "earliest", "isolation.level": "read_committed", "enable.partition.eof": true,
		"enable.auto.commit": false, "go.logs.channel.enable": false})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	md, err := c.GetMetadata(&topic, false, 10000)
	if err != nil {
		t.Fatal(err)
	}
	var tps []kafka.TopicPartition
	for _, pm := range md.Topics[topic].Partitions {
		tps = append(tps, kafka.TopicPartition{Topic: &topic, Partition: pm.ID, Offset: kafka.OffsetBeginning})
	}
	if err := c.Assign(tps); err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]int{}
	eof := map[int32]bool{}
	deadline := time.Now().Add(120 * time.Second)
	for len(eof) < len(tps) {
		if time.Now().After(deadline) {
			t.Fatalf("events topic %s: no end within 120 s", topic)
		}
		switch ev := c.Poll(200).(type) {
		case *kafka.Message:
			var v struct {
				OrderID json.RawMessage `json:"order_id"`
			}
			if json.Unmarshal(ev.Value, &v) != nil || len(v.OrderID) == 0 {
				continue
			}
			o := strings.Trim(string(v.OrderID), `"`)
			id := ""
			for _, h := range ev.Headers {
				if h.Key == outbox.HeaderOutboxID {
					id = string(h.Value)
				}
			}
			if out[o] == nil {
				out[o] = map[string]int{}
			}
			out[o][id]++
		case kafka.PartitionEOF:
			eof[ev.Partition] = true
		}
	}
	return out
}
