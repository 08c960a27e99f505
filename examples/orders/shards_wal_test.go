package main

import (
	"context"
	"fmt"
	"net/url"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
)

// Issue 46, the WAL outbox mode on shards: two PostgreSQL clusters as shards (s1 a database on
// the dev cluster, also holding the directory; s2 a database of the same name on a cluster of
// the test's own, so both shards' slots have the same name), 6 partitions split 3/3, orders
// with events drained in WAL mode across SIGKILLs of the service: every order applied once, on
// its partition's shard, and every order's event once on the events topic (read_committed)
// under a kafkatx-outbox-id no other order carries. Each shard runs its own WAL relay from its
// own slot, with its own checkpoint and transactional.id: with one transactional.id for the
// two same-named slots, the relays fenced each other's Kafka transactions.
func TestShardsInWALModeAcrossSIGKILLs(t *testing.T) {
	testenv.FullTier(t, "a PostgreSQL cluster of its own as the second shard")
	bin := buildOrders(t)
	brokers := testenv.Brokers(t)
	s1 := testenv.Database(t)
	u, err := url.Parse(s1)
	if err != nil {
		t.Fatal(err)
	}
	db := strings.TrimPrefix(u.Path, "/")
	own := testenv.StartOwnPostgres(t, "max_connections = 100")
	ctx := context.Background()
	{
		c, err := pgx.Connect(ctx, own.URL)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize()); err != nil {
			t.Fatal(err)
		}
		c.Close(ctx)
	}
	s2 := dbURL(t, own.URL, db)
	pools := shardPools(t, map[string]string{"s1": s1, "s2": s2})
	topic := testenv.UniqueName(t, "shwal-", 100)
	events := topic + "-events"
	args := []string{"--brokers", brokers, "--database-url", s1, "--shard", "s1=" + s1, "--shard", "s2=" + s2,
		"--topic", topic, "--group", topic, "--events-topic", events, "--partitions", "6", "--batch-size", "50"}
	placeSplit(t, pools["s1"], topic, topic, 6, 3, "s1", "s2")
	const n = 6000
	if r := runOrders(t, bin, 120*time.Second, append(args, "--generate", fmt.Sprint(n), "--produce-only")...); r.code != 0 {
		t.Fatalf("produce: exit %d\n%s", r.code, tail(r.stderr))
	}
	q := shardQuery(t, pools)
	total := func() int64 {
		return q("s1", `SELECT count(*) FROM order_totals`) + q("s2", `SELECT count(*) FROM order_totals`)
	}
	consumer := append(args, "--outbox-mode", "wal", "--instance-id", "shwal-1", "--session-timeout", "6s")
	var logs strings.Builder // every run's stderr
	// Three runs SIGKILLed once they have applied orders (at least 300 more each time).
	for i := 0; i < 3; i++ {
		before := total()
		cmd := exec.Command(bin, append(consumer, "--exit-when-idle", "30s")...)
		var errOut strings.Builder
		cmd.Stderr = &errOut
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, 120*time.Second, fmt.Sprintf("run %d applying orders", i+1), func() bool { return total() >= before+300 },
			func() string { return tail(errOut.String()) })
		_ = cmd.Process.Kill() // SIGKILL
		_ = cmd.Wait()
		logs.WriteString(errOut.String())
	}
	if total() >= n {
		t.Fatalf("every order was applied before the last SIGKILL: nothing left to drain")
	}
	r := runOrders(t, bin, 300*time.Second, append(consumer, "--exit-when-idle", "5s")...)
	if r.code != 0 {
		t.Fatalf("final drain: exit %d\n%s", r.code, tail(r.stderr))
	}
	logs.WriteString(r.stderr)
	// Each shard's relay has a transactional.id of its own: neither fenced the other's Kafka
	// transactions (librdkafka's and the relay's lines naming the fencing; with one id for the
	// two same-named slots, the drain logged them and went on only by restarting streams).
	fenced := 0
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "fenced by a newer instance") {
			fenced++
		}
	}
	if fenced != 0 {
		t.Errorf("%d times a shard's WAL relay was fenced by another's producer", fenced)
	}

	// Each shard in WAL mode on a slot of the same name (the same database and schema names).
	st1, err := outbox.ReadSettings(ctx, pools["s1"], "")
	if err != nil {
		t.Fatal(err)
	}
	st2, err := outbox.ReadSettings(ctx, pools["s2"], "")
	if err != nil {
		t.Fatal(err)
	}
	if st1.Mode != outbox.ModeWAL || st2.Mode != outbox.ModeWAL || st1.Slot != st2.Slot {
		t.Fatalf("shards' outbox settings: s1 %+v, s2 %+v; want WAL mode on a slot of one name", st1, st2)
	}
	if got := total(); got != n {
		t.Fatalf("%d orders applied, want %d", got, n)
	}
	orders := map[string]string{} // order id -> shard
	both := 0
	for shard, parts := range map[string]string{"s1": "0,1,2", "s2": "3,4,5"} {
		var got string
		if err := pools[shard].QueryRow(ctx, `SELECT string_agg(DISTINCT kafka_partition::text, ',' ORDER BY kafka_partition::text) FROM order_totals`).Scan(&got); err != nil || got != parts {
			t.Errorf("%s holds the orders of partitions [%s] (%v); want [%s]", shard, got, err, parts)
		}
		rows, err := pools[shard].Query(ctx, `SELECT order_id::text FROM order_totals`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				t.Fatal(err)
			}
			if _, ok := orders[id]; ok {
				both++
			}
			orders[id] = shard
		}
		rows.Close()
		if v := q(shard, `SELECT count(*) FROM kafkatx.offset_audit WHERE kind IN ('unexplained_move', 'unexplained_skip', 'operator_skip', 'watermark_deleted')`); v != 0 {
			t.Errorf("%s: %d skip or unexplained rows in the offset audit", shard, v)
		}
	}
	if both != 0 || len(orders) != n {
		t.Errorf("%d distinct orders, %d on both shards; want %d, 0", len(orders), both, n)
	}
	ids := readEventIDs(t, brokers, events)
	if ev := tallyEvents(ids, orders); !ev.exact() {
		t.Errorf("events: %v; want all 0", ev)
	}
}
