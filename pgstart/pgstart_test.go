package pgstart_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/pgstart"
)

// Issue "outages" 2: a server in recovery answers 57P03 (cannot_connect_now) — a real
// standby with hot_standby off, as a Patroni member is while it is promoted. Await waits for
// it, logging the condition, and past its bound returns the refusal saying how long it
// waited; promoted, the same server is ready within one backoff. A database that does not
// exist is returned at once, never waited for.
func TestAwaitWaitsForAServerInRecoveryAndNotForAMissingDatabase(t *testing.T) {
	primary := testenv.StartOwnPostgres(t, "")
	standby := primary.StartStandbyWith(t, "hot_standby = off")
	cc, err := pgx.ParseConfig(standby.URL)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	core, logs := observer.New(zap.InfoLevel)
	start := time.Now()
	err = pgstart.Await(ctx, cc, 3*time.Second, zap.New(core))
	took := time.Since(start)
	if err == nil || !strings.Contains(err.Error(), "57P03") || !strings.Contains(err.Error(), "not ready within 3s") {
		t.Fatalf("Await on a standby with hot_standby off: %v; want the 57P03 refusal after the bound", err)
	}
	if took < 3*time.Second || took > 60*time.Second {
		t.Fatalf("Await returned after %s; want the bound of 3s (plus at most the try under way)", took)
	}
	if w := logs.FilterMessage("database not ready at start; waiting for it (bounded)").All(); len(w) == 0 || !strings.Contains(w[0].ContextMap()["condition"].(string), "cannot_connect_now") {
		t.Fatalf("logged %v; want a warning naming cannot_connect_now", logs.All())
	}

	done := make(chan error, 1)
	go func() { done <- pgstart.Await(ctx, cc, time.Minute, zap.New(core)) }()
	time.Sleep(2 * time.Second)
	select {
	case err := <-done:
		t.Fatalf("Await returned %v while the server was in recovery", err)
	default:
	}
	standby.Promote(t)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Await after the promotion: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Await did not return within 60 s of the promotion")
	}
	if logs.FilterMessage("database ready; the service starts").Len() == 0 {
		t.Fatal("no info line when the server became ready")
	}

	// A database that does not exist (3D000): refused at once, nothing waits.
	bad, err := pgx.ParseConfig(strings.Replace(standby.URL, "/postgres?", "/no_such_db?", 1))
	if err != nil {
		t.Fatal(err)
	}
	// "At once": no wait was logged, which the first refusal that Await waits out always is.
	core, logs = observer.New(zap.InfoLevel)
	err = pgstart.Await(ctx, bad, time.Minute, zap.New(core))
	if err == nil || !strings.Contains(err.Error(), "3D000") || logs.Len() != 0 {
		t.Fatalf("Await on a database that does not exist: %v (logged %v); want the 3D000 refusal at once, never waited for", err, logs.All())
	}
}
