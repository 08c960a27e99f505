package main

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/examples/orders/order"
	"github.com/kafkatx/kafkatx/shards"
)

// shardPools opens one pool a named database URL and migrates it (kafkatx's schema and the
// order service's tables), for the shard tests. At the end each database's inactive
// replication slots are dropped (before the database itself, which a slot would hold) and
// the pool closed.
func shardPools(t *testing.T, urls map[string]string) map[string]*pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	pools := map[string]*pgxpool.Pool{}
	for name, url := range urls {
		p, err := pgxpool.New(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_, _ = p.Exec(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database() AND NOT active`)
			p.Close()
		})
		if err := kafkatx.Migrate(ctx, p, ""); err != nil {
			t.Fatal(err)
		}
		if err := order.Migrate(ctx, p); err != nil {
			t.Fatal(err)
		}
		pools[name] = p
	}
	return pools
}

// placeSplit maps partitions 0 to split-1 of group's topic to shard first and split to n-1 to
// shard second, in the directory dir.
func placeSplit(t *testing.T, dir *pgxpool.Pool, group, topic string, n, split int32, first, second string) {
	t.Helper()
	d := shards.NewDirectory(dir, "")
	for p := int32(0); p < n; p++ {
		to := first
		if p >= split {
			to = second
		}
		if _, _, err := d.Assign(context.Background(), group, topic, p, to); err != nil {
			t.Fatal(err)
		}
	}
}

// shardQuery returns a function that reads one number with sql on the named shard (a failure
// ends the test).
func shardQuery(t *testing.T, pools map[string]*pgxpool.Pool) func(shard, sql string) int64 {
	return func(shard, sql string) int64 {
		t.Helper()
		var v int64
		if err := pools[shard].QueryRow(context.Background(), sql).Scan(&v); err != nil {
			t.Fatalf("%s: %s: %v", shard, sql, err)
		}
		return v
	}
}
