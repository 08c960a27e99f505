package walrelay

import (
	"context"
	"fmt"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/outbox"
)

// The cost of each step on a backlog of 200,000 records (1,000 per transaction, keyed, about
// 80-byte values): the writers' WriteTx (emit), then the relay draining it — its time waiting
// for the walsender, decoding and producing, committing Kafka transactions, and its process
// CPU. It logs the figures docs/benchmarks.md quotes.
func TestRelayThroughputAndStepCosts(t *testing.T) {
	if testing.Short() {
		t.Skip("200,000 records")
	}
	b := newBundle(t)
	ctx := context.Background()
	const n, per = 200000, 1000
	recs := make([]outbox.Record, per)
	t0 := time.Now()
	for sent := 0; sent < n; sent += per {
		for i := range recs {
			id := "ORD-" + strconv.Itoa(sent+i)
			recs[i] = outbox.Record{Topic: b.topic, Key: []byte(id), Value: fmt.Appendf(nil, `{"order_id":%q,"customer":"c-%03d","total_cents":%d}`, id, (sent+i)%500, sent+i)}
		}
		if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { _, err := outbox.WriteTx(ctx, tx, recs...); return err }); err != nil {
			t.Fatal(err)
		}
	}
	emit := time.Since(t0)
	cpu0 := processCPU()
	r, _, _ := b.start(t, b.config(t))
	t1 := time.Now()
	for r.Stats().Published < n {
		if time.Since(t1) > 120*time.Second {
			t.Fatalf("%d of %d published in 120 s", r.Stats().Published, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	drain := time.Since(t1)
	cpu := processCPU() - cpu0
	s := r.Stats()
	us := func(d time.Duration) float64 { return float64(d.Microseconds()) / n }
	t.Logf("emit: %.1f us/record wall (WriteTx of %d, one round trip each); relay: %d records in %v (%.0f/s), %d Kafka transactions; "+
		"per record: waiting for the walsender %.1f us, decoding+producing %.1f us (queue full %.1f), Kafka commits %.1f us; relay process CPU %.1f us/record",
		us(emit), per, n, drain.Round(time.Millisecond), n/drain.Seconds(), s.Transactions,
		us(s.Steps.Receive), us(s.Steps.Handle), us(s.Steps.QueueFull), us(s.Steps.Commit), us(cpu))
	// The rate is logged for docs/benchmarks.md, not asserted (speed is measured, not timed
	// in a test); that every record was published within 120 s is checked above.
}

// processCPU is this process's user+system CPU time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
