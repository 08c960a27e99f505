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

// BenchmarkRelayDrain measures how fast the relay drains a backlog of b.N small rows (1,000
// keys, 6 partitions, rows deleted on acknowledgement) and checks that every row reached the
// topic. It reports rows/s for the drain and for writing the backlog in 1,000-row
// transactions. The figures in docs/relay.md come from
//
//	go test -run '^$' -bench BenchmarkRelayDrain -benchtime 100000x ./outbox/relay
//
// KAFKATX_RELAY_BATCH sets Config.BatchSize.
func BenchmarkRelayDrain(b *testing.B) {
	rows := b.N
	tb := setup(b)
	topic := testenv.Topic(b, tb.brokers, 6)
	writeStart := time.Now()
	const perTx = 1000
	for done := 0; done < rows; done += perTx {
		recs := make([]outbox.Record, 0, perTx)
		for i := done; i < min(done+perTx, rows); i++ {
			recs = append(recs, outbox.Record{Topic: topic, Key: []byte(fmt.Sprintf("key-%d", i%1000)), Value: []byte(fmt.Sprintf(`{"n":%d}`, i))})
		}
		tb.write(b, recs...)
	}
	writeTook := time.Since(writeStart)

	cfg := tb.config(b)
	cfg.KeepPublished = 0 // the default: delete on acknowledgement
	if v := os.Getenv("KAFKATX_RELAY_BATCH"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			b.Fatalf("KAFKATX_RELAY_BATCH=%q", v)
		}
		cfg.BatchSize = n
	}
	b.ResetTimer()
	start := time.Now()
	r, stop := tb.start(b, cfg)
	waitFor(b, 10*time.Minute, "the backlog published", func() bool { return r.Stats().Published >= int64(rows) })
	took := time.Since(start)
	b.StopTimer()
	stop()
	if n := topicCount(b, tb.brokers, topic); n != int64(rows) {
		b.Fatalf("topic holds %d records, want %d", n, rows)
	}
	b.ReportMetric(float64(rows)/took.Seconds(), "rows/s")
	b.ReportMetric(float64(rows)/writeTook.Seconds(), "written-rows/s")
}
