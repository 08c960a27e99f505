package main

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
	"github.com/kafkatx/kafkatx/shards"
)

// database creates a database of the test's own in the Patroni cluster, waits until both
// nodes have it (until the replica has replayed CREATE DATABASE, pgx stops at its "database
// does not exist" instead of trying the next host) and returns its multi-host URL; the
// database is dropped at the end, on whichever node leads then.
func (p *patroni) database(t *testing.T, prefix string) string {
	t.Helper()
	ctx := context.Background()
	db := testenv.UniqueName(t, prefix, 40)
	admin, err := pgx.Connect(ctx, p.url)
	if err != nil {
		t.Fatal(err)
	}
	_, err = admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize())
	admin.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			c, err := pgx.Connect(ctx, p.url)
			if err == nil {
				// Its slots first (a slot holds its database; a logical slot left on the leader
				// and not on the replica also keeps scripts/dev-services up patroni waiting).
				_, _ = c.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1 AND NOT active`, db)
				_, err = c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)")
				c.Close(ctx)
				if err == nil {
					return
				}
			}
		}
	})
	dsn := dbURL(t, p.url, db)
	for i := 0; i < 2; i++ {
		testenv.WaitFor(t, 60*time.Second, fmt.Sprintf("database %s on node%d", db, i+1), func() bool {
			_, err := queryInt(ctx, nodeURL(t, dsn, i), "SELECT 1")
			return err == nil
		})
	}
	return dsn
}

// Issue 46, a shard that is a Patroni cluster fails over as the single database does, and so
// does the directory's database. Shard pa is a database of the Patroni pair (multi-host URL,
// target_session_attrs=read-write) holding partitions 0-2; shard dev a database of the dev
// PostgreSQL holding 3-5; the directory a database of its own in the Patroni cluster. The
// service drains orders (with events, in WAL mode: each shard its own slot, pa's a Patroni
// permanent slot; synchronous replication) under a supervisor restarting it on a
// non-zero exit; mid-drain the Patroni leader's Patroni and postmaster are SIGKILLed, taking
// shard pa and the directory down together. Once a node is promoted the service is SIGKILLed
// too, so the one the supervisor starts opens the promoted directory and reads it at its
// assignment; both shards then apply orders again (a chunk produced after the failover
// drains too): every order applied exactly once, on the shard of its
// partition, none on both, the dead letters exactly the pills, no skip row in either shard's
// offset audit, every order's event once on the events topic under a kafkatx-outbox-id no other
// order carries, and the directory's rows unchanged on the promoted node.
func TestShardOnPatroniFailsOverWithTheDirectory(t *testing.T) {
	p := patroniCluster(t) // full tier
	bin := buildOrders(t)
	brokers := testenv.Brokers(t)
	ctx := context.Background()
	p.up(t, "sync") // both nodes streaming, the replica the synchronous standby

	dirURL := p.database(t, "shdir") + "&pool_max_conns=6"
	paURL := p.database(t, "shpa") + "&pool_max_conns=12"
	devURL := testenv.Database(t)
	pools := map[string]*pgxpool.Pool{}
	for name, u := range map[string]string{"dir": dirURL, "pa": paURL, "dev": devURL} {
		pl, err := pgxpool.New(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pl.Close)
		if err := kafkatx.Migrate(ctx, pl, ""); err != nil {
			t.Fatal(err)
		}
		pools[name] = pl
	}
	// Both shards in WAL mode (kafkatx migrate up --outbox-mode wal: the publication, then the
	// slot); shard pa's slot made a Patroni permanent slot, copied to the replica and advanced
	// there, so its WAL relay finds it on the promoted node (as TestPatroniFailoverUnderLoad
	// LosesNothing's WAL mode). The dev shard's slot is dropped before its database.
	t.Cleanup(func() {
		_, _ = pools["dev"].Exec(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database() AND NOT active`)
	})
	for _, name := range []string{"pa", "dev"} {
		if err := outbox.SetMode(ctx, pools[name], "", outbox.ModeWAL); err != nil {
			t.Fatal(err)
		}
	}
	st, err := outbox.ReadSettings(ctx, pools["pa"], "")
	if err != nil {
		t.Fatal(err)
	}
	slot := st.Slot
	t.Cleanup(func() { p.ctlEdit(t, "slots."+slot+"=null") }) // before the database is dropped
	var paDB string
	if err := pools["pa"].QueryRow(ctx, `SELECT current_database()`).Scan(&paDB); err != nil {
		t.Fatal(err)
	}
	p.ctlEdit(t, "slots."+slot+".type=logical", "slots."+slot+".database="+paDB, "slots."+slot+".plugin=pgoutput")
	for i := 0; i < 2; i++ {
		testenv.WaitFor(t, 90*time.Second, fmt.Sprintf("the permanent slot %s on node%d", slot, i+1), func() bool {
			n, err := queryInt(ctx, nodeURL(t, p.url, i), "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '"+slot+"'")
			return err == nil && n == 1
		})
	}
	p.up(t, "sync") // the replica restarted to copy the slot: streaming again
	topic := testenv.Topic(t, brokers, 6)
	events := testenv.Topic(t, brokers, 3)
	testenv.NamedTopic(t, brokers, topic+".dlq", 3, nil)
	group := testenv.Group(t)
	placeSplit(t, pools["dir"], group, topic, 6, 3, "pa", "dev")
	leader, err := p.leader()
	if err != nil {
		t.Fatal(err)
	}
	replica := 1 - leader
	// The directory's rows on the replica before anything is killed (asynchronous: the
	// assignment must not be among the lost commits; the test is about the consumers' door).
	testenv.WaitFor(t, 60*time.Second, "the directory's rows on the replica", func() bool {
		n, err := queryInt(ctx, nodeURL(t, dirURL, replica), "SELECT count(*) FROM kafkatx.shard_directory")
		return err == nil && n == 6
	})

	args := []string{"--brokers", brokers, "--database-url", dirURL, "--shard", "pa=" + paURL, "--shard", "dev=" + devURL,
		"--topic", topic, "--group", group, "--events-topic", events}
	// Orders arrive in chunks of 2,000 (one poison pill each): two before the service starts,
	// then one at a time until after the promotion, so the drain is still going at the kill
	// however long the wait for the synchronous standby takes; then one more.
	const chunk = 2000
	ch := newChunks(t, bin, args, chunk)
	ch.produce()
	ch.produce()
	ch.everySecond()

	// The service under a supervisor: restarted 1 s after a non-zero exit; done at exit 0.
	// Static membership: a restarted service takes its partitions back at once instead of
	// after the killed one's session timeout.
	sv := supervise(t, bin, append(args, "--batch-size", "100", "--exit-when-idle", "6s", "--instance-id", "shpatroni-1", "--session-timeout", "6s"))
	detail := sv.detail

	appliedOn := func(dsn string) (int64, error) {
		return queryInt(ctx, dsn, "SELECT count(*) FROM order_totals")
	}
	// Mid-drain: shard pa has applied some of its partitions' orders, not all.
	testenv.WaitFor(t, 120*time.Second, "shard pa applying orders on the leader", func() bool {
		n, _ := appliedOn(nodeURL(t, paURL, leader))
		return n >= 500
	}, detail)
	// Synchronously, Patroni promotes only the node its /sync key names, and a replica named
	// while it still copies the leader's logical slots may be dropped a loop later: the
	// replica must be the synchronous standby for four of Patroni's loops (loop_wait 2 s) in a
	// row before the kill (TestPatroniFailoverUnderLoadLosesNothing's CI flake).
	var syncSince time.Time
	testenv.WaitFor(t, 90*time.Second, fmt.Sprintf("node%d the synchronous standby for 8 s in a row", replica+1), func() bool {
		if !restOK(p.rest[replica] + "/synchronous") {
			syncSince = time.Time{}
			return false
		}
		if syncSince.IsZero() {
			syncSince = time.Now()
		}
		return time.Since(syncSince) >= 8*time.Second
	})
	if sv.exited() {
		t.Fatalf("the service exited before the kill: no drain to fail over under\n%s", detail())
	}
	lp, lpm := p.pids(t, leader)
	atKill, _ := appliedOn(nodeURL(t, paURL, leader))
	_ = syscall.Kill(lp, syscall.SIGKILL)
	_ = syscall.Kill(lpm, syscall.SIGKILL)
	killed := time.Now()
	testenv.WaitFor(t, 90*time.Second, fmt.Sprintf("node%d promoted", replica+1), func() bool { return restOK(p.rest[replica] + "/primary") })
	promoted := time.Now()
	// The service SIGKILLed: the one the supervisor starts again opens the directory on the
	// promoted node and reads it at its assignment, so what it applies went through the
	// directory's failover.
	before := sv.restarts.Load()
	sv.killCurrent()
	testenv.WaitFor(t, 30*time.Second, "the supervisor restarting the SIGKILLed service", func() bool { return sv.restarts.Load() > before }, detail)
	paAt, err := appliedOn(nodeURL(t, paURL, replica))
	if err != nil {
		t.Fatalf("read shard pa on the promoted node: %v", err)
	}
	if paAt < atKill {
		t.Errorf("synchronous replication: the promoted node holds %d of shard pa's orders, the leader had %d at its kill", paAt, atKill)
	}
	devAt, _ := appliedOn(devURL)
	ch.stop()
	ch.produce() // new traffic after the failover, for both shards
	// The consumers keep going: both shards apply orders after the promotion, through the
	// promoted directory.
	testenv.WaitFor(t, 120*time.Second, "orders applied on the promoted shard pa and on shard dev after the failover", func() bool {
		a, _ := appliedOn(nodeURL(t, paURL, replica))
		d, _ := appliedOn(devURL)
		return a > paAt && d > devAt
	}, detail)
	firstApplied := time.Since(promoted)
	p.up(t, "sync") // the old leader rejoins as a replica (pg_rewind)
	select {
	case <-sv.done:
	case <-time.After(240 * time.Second):
		t.Fatalf("the service did not drain within 240 s of the failover\n%s", detail())
	}
	t.Logf("shard pa had applied %d orders on the leader at the kill; promotion %.1f s after the kill; orders applied on both shards %.2f s after the promotion; service restarts %d",
		atKill, promoted.Sub(killed).Seconds(), firstApplied.Seconds(), sv.restarts.Load())

	// The counts, on the promoted node and the dev shard.
	valid := int64(ch.count()) * (chunk - 1)
	urls := map[string]string{"pa": nodeURL(t, paURL, replica), "dev": devURL}
	orders := map[string]string{}
	both := 0
	var dl int64
	for shard, parts := range map[string]string{"pa": "0,1,2", "dev": "3,4,5"} {
		c, err := pgx.Connect(ctx, urls[shard])
		if err != nil {
			t.Fatal(err)
		}
		var got string
		var sum, skips, d int64
		if err := c.QueryRow(ctx, `SELECT coalesce(string_agg(DISTINCT kafka_partition::text, ',' ORDER BY kafka_partition::text), ''),
			(SELECT coalesce(sum(orders), 0)::bigint FROM customer_totals),
			(SELECT count(*) FROM kafkatx.offset_audit WHERE kind IN ('unexplained_skip', 'operator_skip')),
			(SELECT count(*) FROM kafkatx.dead_letters) FROM order_totals`).Scan(&got, &sum, &skips, &d); err != nil {
			t.Fatal(err)
		}
		if got != parts {
			t.Errorf("shard %s holds the orders of partitions [%s]; want [%s]", shard, got, parts)
		}
		if skips != 0 {
			t.Errorf("shard %s: %d skip rows in the offset audit", shard, skips)
		}
		dl += d
		rows, err := c.Query(ctx, `SELECT order_id::text FROM order_totals`)
		if err != nil {
			t.Fatal(err)
		}
		n := int64(0)
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				t.Fatal(err)
			}
			if _, ok := orders[id]; ok {
				both++
			}
			orders[id] = shard
			n++
		}
		rows.Close()
		c.Close(ctx)
		if sum != n {
			t.Errorf("shard %s: customer_totals counts %d orders, order_totals holds %d", shard, sum, n)
		}
	}
	if int64(len(orders)) != valid || both != 0 || dl != int64(ch.count()) {
		t.Errorf("%d distinct orders (%d on both shards), %d dead letters; want %d, 0, %d", len(orders), both, dl, valid, ch.count())
	}
	dc, err := pgx.Connect(ctx, nodeURL(t, dirURL, replica))
	if err != nil {
		t.Fatal(err)
	}
	es, err := shards.NewDirectory(dc, "").List(ctx, group)
	dc.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 6 {
		t.Errorf("the promoted directory holds %d rows of the group; want 6", len(es))
	}
	for _, e := range es {
		if want := map[bool]string{true: "pa", false: "dev"}[e.Partition < 3]; e.Shard != want || e.Epoch != 1 || e.State != shards.StateActive {
			t.Errorf("directory row %+v; want active on %s at epoch 1", e, want)
		}
	}
	ids := readEventIDs(t, brokers, events)
	if ev := tallyEvents(ids, orders); !ev.exact() {
		t.Errorf("events: %v; want all 0", ev)
	}
	if t.Failed() {
		t.Logf("service log:\n%s", detail())
	}
}
