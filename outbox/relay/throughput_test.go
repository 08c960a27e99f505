package relay

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
)

// Measures how fast the relay drains a backlog of small rows (KAFKATX_RELAY_ROWS, default
// 20,000; the figures in docs/relay.md use 100,000) and checks every row reached the topic.
func TestRelayThroughput(t *testing.T) {
	rows := 20000
	if v := os.Getenv("KAFKATX_RELAY_ROWS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("KAFKATX_RELAY_ROWS=%q", v)
		}
		rows = n
	}
	b := setup(t)
	topic := testenv.Topic(t, b.brokers, 6)
	writeStart := time.Now()
	const perTx = 1000
	for done := 0; done < rows; done += perTx {
		recs := make([]outbox.Record, 0, perTx)
		for i := done; i < min(done+perTx, rows); i++ {
			recs = append(recs, outbox.Record{Topic: topic, Key: []byte(fmt.Sprintf("key-%d", i%1000)), Value: []byte(fmt.Sprintf(`{"n":%d}`, i))})
		}
		b.write(t, recs...)
	}
	writeTook := time.Since(writeStart)

	start := time.Now()
	cfg := b.config(t)
	cfg.KeepPublished = 0 // the default: delete on acknowledgement
	if v := os.Getenv("KAFKATX_RELAY_BATCH"); v != "" {
		cfg.BatchSize, _ = strconv.Atoi(v)
	}
	r, stop := b.start(t, cfg)
	waitFor(t, 10*time.Minute, "the backlog published", func() bool { return r.Stats().Published >= int64(rows) })
	took := time.Since(start)
	stop()
	if n := topicCount(t, b.brokers, topic); n != int64(rows) {
		t.Fatalf("topic holds %d records, want %d", n, rows)
	}
	t.Logf("wrote %d rows in %d-row transactions in %s (%.0f rows/s); relay drained them in %s: %.0f rows/s",
		rows, perTx, writeTook.Round(time.Millisecond), float64(rows)/writeTook.Seconds(), took.Round(time.Millisecond), float64(rows)/took.Seconds())
}
