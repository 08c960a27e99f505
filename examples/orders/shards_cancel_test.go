package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/examples/orders/order"
	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/shards"
)

// Issue 46: orders --move-partition P --move-cancel cancels a move its mover left after the
// target committed (partition 1's watermark and orders copied to s2, still on s1, the row
// moving): afterwards s2 holds none of partition 1's orders, no watermark of it and customer
// totals equal to its own orders, s1 still holds all of them, and the directory row is active
// on s1 at epoch 3; a second cancel exits 1 (no move in progress).
func TestOrdersMoveCancel(t *testing.T) {
	bin := buildOrders(t)
	brokers := testenv.Brokers(t)
	ctx := context.Background()
	urls := map[string]string{"s1": testenv.Database(t), "s2": testenv.Database(t)}
	pools := shardPools(t, urls)
	topic := testenv.UniqueName(t, "shards-cancel-", 100)
	args := []string{"--brokers", brokers, "--database-url", urls["s1"], "--shard", "s1=" + urls["s1"], "--shard", "s2=" + urls["s2"],
		"--topic", topic, "--group", topic, "--events-topic", "", "--partitions", "2", "--batch-size", "50"}
	if _, _, err := shards.NewDirectory(pools["s1"], "").Assign(ctx, topic, topic, 1, "s1"); err != nil {
		t.Fatal(err)
	}
	if r := runOrders(t, bin, 120*time.Second, append(args, "--generate", "200", "--produce-only")...); r.code != 0 {
		t.Fatalf("produce: exit %d\n%s", r.code, tail(r.stderr))
	}
	if r := runOrders(t, bin, 300*time.Second, append(args, "--exit-when-idle", "5s")...); r.code != 0 {
		t.Fatalf("drain: exit %d\n%s", r.code, tail(r.stderr))
	}
	q := shardQuery(t, pools)
	p1 := `SELECT count(*) FROM order_totals WHERE kafka_partition = 1`
	before := q("s1", p1)
	if before == 0 || q("s1", `SELECT count(*) FROM order_totals`) != 200 {
		t.Fatalf("after the drain: %d orders of partition 1 on s1, %d in all", before, q("s1", `SELECT count(*) FROM order_totals`))
	}
	// What a mover that died after the target's commit leaves.
	if _, err := pools["s1"].Exec(ctx, `UPDATE kafkatx.shard_directory SET state = 'moving', moving_to = 's2', epoch = 2 WHERE topic = $1 AND partition = 1`, topic); err != nil {
		t.Fatal(err)
	}
	ftx, err := pools["s1"].Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ftx.Rollback(ctx) //nolint:errcheck
	err = pgx.BeginFunc(ctx, pools["s2"], func(ttx pgx.Tx) error {
		if _, err := ttx.Exec(ctx, `INSERT INTO kafkatx.watermarks (group_id, topic, partition, next_offset, first_offset) VALUES ($1, $1, 1, 1, 0)`, topic); err != nil {
			return err
		}
		return order.MovePartition(ctx, ftx, ttx, topic, topic, 1)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := ftx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := q("s2", p1); n != before {
		t.Fatalf("the simulated copy put %d orders on s2, want %d", n, before)
	}
	r := runOrders(t, bin, 120*time.Second, append(args, "--move-partition", "1", "--move-cancel", "--move-reason", "test: cancel")...)
	if r.code != 0 || !strings.Contains(r.stdout, `"shard":"s1"`) || !strings.Contains(r.stdout, `"epoch":3`) {
		t.Fatalf("--move-cancel: exit %d\n%s%s", r.code, r.stdout, tail(r.stderr))
	}
	got := fmt.Sprintf("s1 p1=%d s2 p1=%d s2 marks=%d s2 customers off by %d", q("s1", p1), q("s2", p1), q("s2", `SELECT count(*) FROM kafkatx.watermarks`),
		q("s2", `SELECT coalesce(sum(total_cents), 0) FROM customer_totals`)-q("s2", `SELECT coalesce(sum(total_cents), 0) FROM order_totals`))
	if want := fmt.Sprintf("s1 p1=%d s2 p1=0 s2 marks=0 s2 customers off by 0", before); got != want {
		t.Fatalf("after the cancel: %s; want %s", got, want)
	}
	if r := runOrders(t, bin, 120*time.Second, append(args, "--move-partition", "1", "--move-cancel", "--move-reason", "again")...); r.code != 1 || !strings.Contains(r.stderr, "no move in progress") {
		t.Fatalf("a second --move-cancel: exit %d\n%s", r.code, tail(r.stderr))
	}
}
