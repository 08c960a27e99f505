package relay

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
)

// A second fresh-eyes attack: with the broker frozen, a stopped relay waited all of
// ShutdownTimeout (30 s) for delivery reports and then librdkafka's close until the broker
// answered again, and its /readyz answered 503 with no reason. Now Ready names Kafka after
// NotReadyAfter; a stop returns once Kafka has answered nothing for publish.CloseWait (plus
// the bounded close); a new relay publishes every row once the broker answers. It freezes the
// shared broker: `make test-outages` runs it alone.
func TestStopWithTheBrokerFrozenIsBounded(t *testing.T) {
	testenv.NeedBrokerKills(t)
	b := setup(t)
	topic := testenv.Topic(t, b.brokers, 3)
	cfg := b.config(t)
	cfg.KeepPublished = 0
	cfg.ShutdownTimeout = 30 * time.Second // the default
	r, stop := b.start(t, cfg)
	ctx := context.Background()
	write := func(tag string, n int) {
		recs := make([]outbox.Record, n)
		for i := range recs {
			recs[i] = outbox.Record{Topic: topic, Key: []byte(fmt.Sprint("k", i%10)), Value: []byte(fmt.Sprint(tag, "-", i))}
		}
		b.write(t, recs...)
	}
	write("before", 100)
	waitFor(t, 60*time.Second, "the first rows published", func() bool { return r.Stats().Published >= 100 })
	resume := testenv.StopBroker(t, b.brokers)
	write("during", 100)
	waitFor(t, NotReadyAfter+60*time.Second, "Ready naming Kafka", func() bool {
		err := r.Ready(ctx)
		return err != nil && strings.Contains(err.Error(), "Kafka has not answered")
	})
	t0 := time.Now()
	stop() // fails the test if Run does not return nil within 30 s
	took := time.Since(t0)
	t.Logf("stopped %s after the cancel, the broker frozen", took.Round(time.Millisecond))
	if took > 20*time.Second {
		t.Fatalf("the stop took %s with the broker frozen; want publish.CloseWait plus the bounded close (about 10 s)", took)
	}
	resume()
	b.start(t, cfg)
	waitFor(t, 90*time.Second, "the outbox empty", func() bool {
		var n int64
		_ = b.pool.QueryRow(ctx, `SELECT count(*) FROM `+b.t.Outbox).Scan(&n)
		return n == 0
	})
	seen := map[string]bool{}
	for _, m := range readAll(t, b.brokers, topic) {
		seen[string(m.Value)] = true
	}
	for _, tag := range []string{"before", "during"} {
		for i := 0; i < 100; i++ {
			if !seen[fmt.Sprint(tag, "-", i)] {
				t.Fatalf("%s-%d was not published", tag, i)
			}
		}
	}
}
