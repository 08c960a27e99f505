package walrelay

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// A second fresh-eyes attack: a WAL relay's /readyz answered 200 through a 40 s broker freeze
// while nothing was published (a frozen broker keeps its connections open, so librdkafka
// reports no broker down). Ready now reports the unanswered transaction commit after
// NotReadyAfter; a stop while it is frozen returns within a bound (it waited for the broker);
// a new relay is ready once the broker answers, and every record is published once.
// It freezes the shared broker: `make test-outages` runs it alone.
func TestReadyReportsAFrozenBroker(t *testing.T) {
	testenv.NeedBrokerKills(t)
	b := newBundle(t)
	r, cancel, done := b.start(t, b.config(t))
	ctx := context.Background()
	b.write(t, "before", 100, 10)
	wait := func(d time.Duration, what string, cond func() bool) {
		t.Helper()
		end := time.Now().Add(d)
		for !cond() {
			if time.Now().After(end) {
				t.Fatalf("timed out after %s waiting for %s (Ready: %v)", d, what, r.Ready(ctx))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	wait(60*time.Second, "the first records published", func() bool { return r.Stats().Published >= 100 })
	resume := testenv.StopBroker(t, b.brokers)
	frozen := time.Now()
	b.write(t, "during", 100, 10)
	wait(NotReadyAfter+15*time.Second, "Ready reporting the broker that does not answer", func() bool {
		err := r.Ready(ctx)
		return err != nil && strings.Contains(err.Error(), "Kafka has not answered")
	})
	t.Logf("not ready %s after the freeze: %v", time.Since(frozen).Round(time.Millisecond), r.Ready(ctx))
	// A stop while the broker is frozen returns within a bound: the commit in progress (60 s
	// at most: librdkafka's commit cannot be cancelled), the abort (publish.CloseWait when
	// stopping, 30 s before) and the producer's close (publish.CloseWait, before: until the
	// broker answered again).
	b.write(t, "stop", 100, 10)
	time.Sleep(time.Second) // the stream is in its commit
	stopped := time.Now()
	cancel()
	select {
	case err := <-done:
		done <- err // for the cleanup's wait
		t.Logf("stopped %s after the cancel, the broker frozen", time.Since(stopped).Round(time.Millisecond))
	case <-time.After(80 * time.Second):
		t.Fatalf("Run did not return within 80 s of a stop with the broker frozen")
	}
	resume()
	r, _, _ = b.start(t, b.config(t))
	wait(90*time.Second, "a new relay ready once the broker answers", func() bool { return r.Ready(ctx) == nil && r.Stats().Streaming })
	msgs := readAll(t, b.brokers, b.topic, 300, 2*time.Second, 90*time.Second)
	onceEach(t, msgs, append(append(values("before", 100), values("during", 100)...), values("stop", 100)...))
}
