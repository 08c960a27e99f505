package main

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// The order service with --group-protocol consumer (KIP-848) on the real broker: two
// processes share the group, the second joining while the first drains; every order is
// applied once (20,000 messages), every poison pill dead-lettered once. --session-timeout with it, or a
// protocol kafkatx does not know, is refused before anything starts (exit 2).
func TestOrdersWithTheConsumerGroupProtocol(t *testing.T) {
	t.Parallel()
	brokers := testenv.Brokers(t)
	db := testenv.Database(t)
	bin := buildOrders(t)
	topic := testenv.UniqueName(t, "kip848-", 100)
	common := []string{"--brokers", brokers, "--database-url", db, "--topic", topic, "--group", topic, "--events-topic", "", "--partitions", "4"}

	for _, bad := range [][]string{{"--group-protocol", "consumer", "--session-timeout", "10s"}, {"--group-protocol", "streams"}} {
		r := runOrders(t, bin, 30*time.Second, append(common, bad...)...)
		if r.code != 2 || !strings.Contains(r.stderr, bad[0]) {
			t.Fatalf("orders %v: exit %d, stderr %q; want 2 and a line naming %s", bad, r.code, r.stderr, bad[0])
		}
	}

	p := runOrders(t, bin, 60*time.Second, append(common, "--generate", "20000", "--poison-every", "1000", "--produce-only")...)
	var prod struct {
		Valid      int64 `json:"valid"`
		TotalCents int64 `json:"total_cents"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(p.stdout)), &prod); p.code != 0 || err != nil || prod.Valid != 19980 {
		t.Fatalf("produce: exit %d, %v, stdout %q, stderr:\n%s", p.code, err, p.stdout, tail(p.stderr))
	}
	consume := append(common, "--group-protocol", "consumer", "--exit-when-idle", "4s", "--batch-size", "20")
	var wg sync.WaitGroup
	results := make([]runResult, 2)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = runOrders(t, bin, 180*time.Second, consume...)
		}()
		time.Sleep(300 * time.Millisecond) // the second joins while the first drains
	}
	wg.Wait()
	var processed int64
	for i, r := range results {
		if r.code != 0 {
			t.Fatalf("consumer %d: exit %d; stderr:\n%s", i, r.code, tail(r.stderr))
		}
		var sum struct {
			Processed int64 `json:"processed"`
		}
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &sum); err != nil {
			t.Fatalf("consumer %d summary %q: %v", i, r.stdout, err)
		}
		t.Logf("consumer %d processed %d in %s", i, sum.Processed, r.took.Round(100*time.Millisecond))
		if sum.Processed == 0 {
			t.Fatalf("consumer %d processed nothing: the two did not share the group", i)
		}
		processed += sum.Processed
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var orders, cents, dead int64
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM order_totals), (SELECT coalesce(sum(total_cents), 0) FROM order_totals),
		(SELECT count(*) FROM kafkatx.dead_letters)`).Scan(&orders, &cents, &dead); err != nil {
		t.Fatal(err)
	}
	if orders != 19980 || cents != prod.TotalCents || dead != 20 {
		t.Fatalf("orders %d (want 19980), cents %d (want %d), dead letters %d (want 20)", orders, cents, prod.TotalCents, dead)
	}
	if processed < 19980 {
		t.Fatalf("the two processes processed %d messages together, want at least the 19,980 orders", processed)
	}
}
