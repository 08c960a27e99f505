package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// TestCrashPillsAreDeadLetteredAndEveryOtherOrderAppliedOnce drives `--crash-every` as a
// supervisor would: the service exits with status 3 on each crash pill, is started again with
// the same --instance-id, and ends with exactly the pills dead-lettered (class crash, after
// --max-attempts crashes of their own) and every other order applied once — the crash
// isolation in pieces (docs/consumer.md), through the example.
func TestCrashPillsAreDeadLetteredAndEveryOtherOrderAppliedOnce(t *testing.T) {
	t.Parallel()
	bin := buildOrders(t)
	brokers := testenv.Brokers(t)
	dsn := testenv.Database(t)
	topic := testenv.Topic(t, brokers, 3)
	testenv.NamedTopic(t, brokers, topic+".dlq", 3, nil)
	args := []string{"--brokers", brokers, "--database-url", dsn, "--topic", topic, "--group", testenv.Group(t), "--events-topic", "",
		"--instance-id", "crash-" + topic, "--session-timeout", "6s", "--max-attempts", "3", "--batch-size", "500"}
	p := runOrders(t, bin, 60*time.Second, append(args, "--generate", "3000", "--crash-every", "1000", "--produce-only")...)
	if p.code != 0 || !strings.Contains(p.stdout, `"crash":3`) || !strings.Contains(p.stdout, `"valid":2997`) {
		t.Fatalf("produce: exit %d, stdout %q\n%s", p.code, p.stdout, p.stderr)
	}
	restarts := 0
	for {
		r := runOrders(t, bin, 120*time.Second, append(args, "--exit-when-idle", "2s")...)
		if r.code == 0 {
			break
		}
		if r.code != 3 || !strings.Contains(r.stderr, "crash pill") {
			t.Fatalf("run %d: exit %d, want 3 from a crash pill; stderr:\n%s", restarts+1, r.code, r.stderr)
		}
		restarts++
		if restarts > 40 {
			t.Fatalf("more than 40 restarts; last stderr:\n%s", r.stderr)
		}
	}
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	q := func(sql string) int64 {
		var n int64
		if err := pool.QueryRow(context.Background(), sql).Scan(&n); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return n
	}
	dl, crash := q("SELECT count(*) FROM kafkatx.dead_letters"), q("SELECT count(*) FROM kafkatx.dead_letters WHERE error_class = 'crash' AND attempts = 3")
	orders, pills := q("SELECT count(*) FROM order_totals"), q("SELECT count(*) FROM order_totals WHERE order_id LIKE 'CRASH-%'")
	counted := q("SELECT coalesce(sum(orders), 0) FROM customer_totals")
	t.Logf("3 crash pills dead-lettered after %d restarts", restarts)
	if dl != 3 || crash != 3 || orders != 2997 || pills != 0 || counted != 2997 {
		t.Fatalf("after %d restarts: %d dead letters (%d of class crash at 3 attempts), %d orders (%d pills), %d counted; want 3, 3, 2997, 0, 2997",
			restarts, dl, crash, orders, pills, counted)
	}
	// Each pill: 3 crashes of its own at least; at most its batch's crash, the levels of the
	// search (1,000 offsets in flight: 63, then 4, then probes), its 3 crashes, and as many
	// again for a wide level that another partition's pill misled.
	if limit := 3 * (1 + 2 + 3 + 3); restarts > limit || restarts < 3*3 {
		t.Fatalf("%d restarts for 3 pills; want between %d and %d", restarts, 3*3, limit)
	}
}
