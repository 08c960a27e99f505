package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// A fresh-eyes attack: 100 valid orders of 1,000,000 × 999,999,999.99 made the producer's
// summary print total_cents -8446744073809551616 (an int64 wrapped): a false mismatch for
// whoever checks the totals against it. The sum is exact at any size.
func TestProduceSummaryTotalIsExactPastInt64(t *testing.T) {
	brokers := testenv.Brokers(t)
	bin := buildOrders(t)
	var lines []string
	for i := 0; i < 100; i++ {
		lines = append(lines, fmt.Sprintf(`{"order_id": "WHALE-%d", "customer": "whale", "item": "yacht", "quantity": 1000000, "price": 999999999.99}`, i))
	}
	file := filepath.Join(t.TempDir(), "whales.jsonl")
	if err := os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := runOrders(t, bin, 60*time.Second, "--brokers", brokers, "--database-url", "postgres://unused@127.0.0.1:1/x",
		"--topic", testenv.Topic(t, brokers, 1), "--produce", file, "--produce-only")
	// 100 × 1,000,000 × 99,999,999,999 cents.
	if want := `"total_cents":9999999999900000000}`; r.code != 0 || !strings.Contains(r.stdout, want) {
		t.Fatalf("exit %d, stdout %q, want %s; stderr:\n%s", r.code, r.stdout, want, r.stderr)
	}
}
