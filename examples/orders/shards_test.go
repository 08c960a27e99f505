package main

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/shards"
)

// Two PostgreSQL clusters as shards (s1 a database on the dev cluster, also holding the
// directory; s2 a cluster of the test's own), 6 partitions split 3/3: orders drained across
// SIGKILLs of the service are each applied once, on their partition's shard. Then partition 1
// moves to s2 (orders --move-partition, its orders with it) while the service drains more
// and is SIGKILLed: every order once, none on both shards, none of partition 1 left on s1, the
// directory on s2 at a higher epoch, a shard_move row on each shard and no unexplained one.
func TestShardsAcrossSIGKILLsAndAMoveUnderLoad(t *testing.T) {
	testenv.FullTier(t, "a PostgreSQL cluster of its own as the second shard")
	bin := buildOrders(t)
	brokers := testenv.Brokers(t)
	s1 := testenv.Database(t)
	own := testenv.StartOwnPostgres(t, "max_connections = 100")
	s2 := own.URL
	ctx := context.Background()
	pools := shardPools(t, map[string]string{"s1": s1, "s2": s2})
	topic := testenv.UniqueName(t, "shards-", 100)
	args := []string{"--brokers", brokers, "--database-url", s1, "--shard", "s1=" + s1, "--shard", "s2=" + s2,
		"--topic", topic, "--group", topic, "--events-topic", "", "--partitions", "6", "--batch-size", "50"}
	placeSplit(t, pools["s1"], topic, topic, 6, 3, "s1", "s2")
	produce := func(n int) {
		if r := runOrders(t, bin, 120*time.Second, append(args, "--generate", fmt.Sprint(n), "--poison-every", "1000", "--produce-only")...); r.code != 0 {
			t.Fatalf("produce: exit %d\n%s", r.code, tail(r.stderr))
		}
	}
	q := shardQuery(t, pools)
	total := func() int64 {
		return q("s1", `SELECT count(*) FROM order_totals`) + q("s2", `SELECT count(*) FROM order_totals`)
	}
	start := func() *exec.Cmd {
		cmd := exec.Command(bin, append(args, "--instance-id", "shards-1", "--session-timeout", "6s", "--exit-when-idle", "20s")...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	kill := func(cmd *exec.Cmd) {
		_ = cmd.Process.Kill() // SIGKILL
		_ = cmd.Wait()
	}
	drain := func() {
		if r := runOrders(t, bin, 300*time.Second, append(args, "--instance-id", "shards-1", "--session-timeout", "6s", "--exit-when-idle", "5s")...); r.code != 0 {
			t.Fatalf("final drain: exit %d\n%s", r.code, tail(r.stderr))
		}
	}

	produce(12000)
	for i := 0; i < 3; i++ {
		cmd := start()
		time.Sleep(time.Duration(800+300*i) * time.Millisecond)
		kill(cmd)
	}
	drain()
	if n := total(); n != 11988 {
		t.Fatalf("after the first drain: %d orders, want 11,988", n)
	}
	for shard, parts := range map[string]string{"s1": "0,1,2", "s2": "3,4,5"} {
		var got string
		if err := pools[shard].QueryRow(ctx, `SELECT string_agg(DISTINCT kafka_partition::text, ',') FROM order_totals`).Scan(&got); err != nil || got != parts {
			t.Fatalf("%s holds the orders of partitions [%s] (%v); want [%s]", shard, got, err, parts)
		}
	}

	produce(30000)
	cmd := start()
	deadline := time.Now().Add(60 * time.Second)
	for total() < 11988+1000 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	moveStart := time.Now()
	if r := runOrders(t, bin, 120*time.Second, append(args, "--move-partition", "1", "--move-to", "s2", "--move-reason", "test: move under load")...); r.code != 0 ||
		!strings.Contains(r.stdout, `"shard":"s2"`) {
		kill(cmd)
		t.Fatalf("orders --move-partition: exit %d, stdout %q\n%s", r.code, r.stdout, tail(r.stderr))
	}
	applied := total() - 11988
	t.Logf("move took %s with %d of 29,970 new orders applied", time.Since(moveStart).Round(time.Millisecond), applied)
	if applied >= 29970 {
		t.Fatalf("the drain ended before the move did (%d new orders applied): no load to move under", applied)
	}
	time.Sleep(500 * time.Millisecond)
	kill(cmd)
	drain()
	if n := total(); n != 41958 {
		t.Fatalf("after the move: %d orders, want 41,958", n)
	}
	if n := q("s1", `SELECT count(*) FROM order_totals WHERE kafka_partition = 1`); n != 0 {
		t.Errorf("s1 still holds %d orders of the moved partition", n)
	}
	var both int64
	ids := map[string]bool{}
	for _, shard := range []string{"s1", "s2"} {
		rows, err := pools[shard].Query(ctx, `SELECT order_id FROM order_totals`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				t.Fatal(err)
			}
			if ids[id] {
				both++
			}
			ids[id] = true
		}
		rows.Close()
	}
	if both != 0 {
		t.Errorf("%d orders on both shards", both)
	}
	for _, shard := range []string{"s1", "s2"} {
		if n := q(shard, `SELECT (SELECT count(*) FROM order_totals) - (SELECT coalesce(sum(orders), 0) FROM customer_totals)`); n != 0 {
			t.Errorf("%s: customer_totals count %d orders more or less than order_totals", shard, -n)
		}
		if n := q(shard, `SELECT count(*) FROM kafkatx.offset_audit WHERE kind = 'shard_move'`); n != 1 {
			t.Errorf("%s: %d shard_move audit rows, want 1", shard, n)
		}
		if n := q(shard, `SELECT count(*) FROM kafkatx.offset_audit WHERE kind IN ('unexplained_move', 'unexplained_skip', 'watermark_deleted')`); n != 0 {
			t.Errorf("%s: %d unexplained audit rows", shard, n)
		}
	}
	es, err := shards.NewDirectory(pools["s1"], "").List(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if e.Partition == 1 && (e.Shard != "s2" || e.Epoch != 2 || e.State != shards.StateActive) {
			t.Errorf("partition 1 in the directory: %+v; want active on s2 at epoch 2", e)
		}
	}
}
