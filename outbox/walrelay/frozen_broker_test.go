package walrelay

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// A second fresh-eyes attack: a WAL relay's /readyz answered 200 through a 40 s broker freeze
// while nothing was published (a frozen broker keeps its connections open, so librdkafka
// reports no broker down). Ready now reports the unanswered transaction commit after
// NotReadyAfter, is ready again once the broker answers, and every record is published once.
// The freeze stays under the dev broker's broker.session.timeout.ms (20 s): longer, the
// single-node broker fences itself on resuming (scripts/dev-services).
// It freezes the shared broker: `make test-outages` runs it alone.
func TestReadyReportsAFrozenBroker(t *testing.T) {
	testenv.NeedBrokerKills(t)
	b := newBundle(t)
	r, _, _ := b.start(t, b.config(t))
	ctx := context.Background()
	b.write(t, "before", 100, 10)
	ready := func() string { return fmt.Sprintf("Ready: %v", r.Ready(ctx)) }
	wait := func(d time.Duration, what string, cond func() bool) {
		t.Helper()
		testenv.WaitFor(t, d, what, cond, ready)
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
	resume()
	wait(90*time.Second, "ready again once the broker answers", func() bool { return r.Ready(ctx) == nil })
	msgs := readAll(t, b.brokers, b.topic, 200, 2*time.Second, 90*time.Second)
	onceEach(t, msgs, append(values("before", 100), values("during", 100)...))
}
