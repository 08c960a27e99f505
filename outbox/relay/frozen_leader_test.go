package relay

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

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
	a.expect(t, "LEADER", 60*time.Second)
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
	waitCount(t, b.brokers, topic, 100, 60*time.Second)

	frozen := time.Now()
	a.signal(t, syscall.SIGSTOP)
	defer a.signal(t, syscall.SIGCONT)
	write(100, 200)
	sb.expect(t, "LEADER", leaderTimeout+60*time.Second)
	takeover := time.Since(frozen)
	waitCount(t, b.brokers, topic, 300, 60*time.Second)
	a.signal(t, syscall.SIGCONT)
	write(300, 100)
	waitCount(t, b.brokers, topic, 400, 60*time.Second)
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

// A leader frozen inside its mark — the rows deleted, the transaction not committed, their
// locks held — does not hold the next leader's marks: the mark's transaction is ended by
// PostgreSQL after LeaderTimeout (idle_in_transaction_session_timeout), so the new leader,
// which publishes those rows again (same ids), deletes them, and the outbox empties. Without
// it the new leader's delete waited for the frozen process's locks for as long as it stayed
// frozen, and a new leader silent that long was deposed by its own timeout (a fresh-eyes
// attack saw 12 s with nothing published, then the leader's own idle-session timeout).
func TestLeaderFrozenInsideItsMarkDoesNotHoldTheNextLeader(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testenv.Topic(t, b.brokers, 3)
	const leaderTimeout = 3 * time.Second
	env := envChildLeader + "=" + leaderTimeout.String()
	a := b.startChild(t, "stop-in-mark", env)
	a.expect(t, "LEADER", 60*time.Second)
	sb := b.startChild(t, "run", env)
	if sb.printed("LEADER", time.Second) {
		t.Fatal("the second relay became leader while the first was alive")
	}
	defer a.signal(t, syscall.SIGCONT)
	var recs []outbox.Record
	for i := 0; i < 100; i++ {
		recs = append(recs, outbox.Record{Topic: topic, Key: []byte(fmt.Sprintf("k%d", i%5)), Value: []byte(fmt.Sprintf("v%d", i))})
	}
	b.write(t, recs...)
	a.expect(t, "IN MARK", 60*time.Second) // published, rows deleted, the transaction open
	a.signal(t, syscall.SIGSTOP)
	sb.expect(t, "LEADER", leaderTimeout+60*time.Second)
	led := time.Now()
	deadline := led.Add(3*leaderTimeout + 10*time.Second)
	for {
		var pending int64
		if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+pgx.Identifier{b.schema, "outbox"}.Sanitize()+` WHERE state = 'pending'`).Scan(&pending); err != nil {
			t.Fatal(err)
		}
		if pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rows still pending %s after the new leader took over: its mark waits for the frozen leader's locks", pending, time.Since(led).Round(time.Millisecond))
		}
		time.Sleep(100 * time.Millisecond)
	}
	seen := map[string]bool{}
	for _, m := range readAll(t, b.brokers, topic) {
		id, _ := header(m, outbox.HeaderOutboxID)
		seen[id] = true
	}
	if len(seen) != 100 {
		t.Fatalf("%d distinct ids published, want 100", len(seen))
	}
	t.Logf("outbox empty %s after the new leader took over (LeaderTimeout %s)", time.Since(led).Round(time.Millisecond), leaderTimeout)
}
