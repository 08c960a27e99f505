package relay

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
)

// A leader frozen (SIGSTOP: its session stays open, its kernel answers TCP keepalives) is
// deposed by PostgreSQL once its session stays silent for LeaderTimeout, and the standby
// takes over and publishes what is written meanwhile. Resumed, the old leader finds its
// session ended and does not lead again while the new one runs; every row is published.
// Before, the frozen leader kept the lock as long as it was frozen: nothing was published
// (a fresh-eyes attack held 60,000 events for 74 s, the standby's /readyz 200 throughout).
func TestFrozenLeaderIsDeposedAndTheStandbyPublishes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testenv.Topic(t, b.brokers, 3)
	const leaderTimeout = 3 * time.Second
	env := envChildLeader + "=" + leaderTimeout.String()
	a := b.startChild(t, "run", env)
	a.expect(t, "LEADER", 30*time.Second)
	sb := b.startChild(t, "run", env)
	if sb.printed("LEADER", 2*time.Second) {
		t.Fatal("the second relay became leader while the first was alive")
	}
	write := func(from, n int) {
		var recs []outbox.Record
		for i := from; i < from+n; i++ {
			recs = append(recs, outbox.Record{Topic: topic, Key: []byte(fmt.Sprintf("k%d", i%5)), Value: []byte(fmt.Sprintf("v%d", i))})
		}
		b.write(t, recs...)
	}
	write(0, 100)
	waitCount(t, b.brokers, topic, 100, 20*time.Second)

	frozen := time.Now()
	a.signal(t, syscall.SIGSTOP)
	defer a.signal(t, syscall.SIGCONT)
	write(100, 200)
	sb.expect(t, "LEADER", leaderTimeout+15*time.Second)
	takeover := time.Since(frozen)
	waitCount(t, b.brokers, topic, 300, 20*time.Second)
	a.signal(t, syscall.SIGCONT)
	write(300, 100)
	waitCount(t, b.brokers, topic, 400, 20*time.Second)
	if a.printed("LEADER", time.Second) {
		t.Fatal("the resumed leader leads again beside the new one")
	}
	seen := map[string]bool{}
	for _, m := range readAll(t, b.brokers, topic) {
		id, _ := header(m, outbox.HeaderOutboxID)
		seen[id] = true
	}
	for row, id := range b.outboxIDs(t) {
		if !seen[id] {
			t.Fatalf("row %d never published", row)
		}
	}
	t.Logf("standby took over %s after the leader froze (LeaderTimeout %s, standby interval 200ms)", takeover.Round(time.Millisecond), leaderTimeout)
}
