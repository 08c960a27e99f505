package main

import (
	"bytes"
	"context"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox/walrelay"
)

// `kafkatx relay --health-addr` started while its PostgreSQL is in recovery (a standby being
// promoted: 57P03) answers probes while it waits — /healthz 200, /readyz 503 naming the wait —
// so that a liveness probe does not restart it mid-failover (before, nothing listened until
// the relay ran: connection refused), and once the standby is promoted it leads and /readyz
// answers 200.
func TestRelayCommandAnswersProbesWhileItWaitsForTheDatabase(t *testing.T) {
	t.Parallel()
	brokers := testenv.Brokers(t)
	primary := testenv.StartOwnPostgres(t, "")
	standby := primary.StartStandbyWith(t, "hot_standby = off")
	cli := buildCLI(t)
	addr := testenv.FreeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, cli, "relay", "--migrate", "--brokers", brokers, "--database-url", standby.URL, "--health-addr", addr)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill() //nolint:errcheck
	get := func(path string) (int, string) { return testenv.Get(addr, path) }
	time.Sleep(3 * time.Second) // pgstart waits for the standby
	if code, body := get("/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz while waiting for the database: %d %s, want 200\n%s", code, body, stderr.String())
	}
	if code, body := get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "waiting for the database") {
		t.Fatalf("/readyz while waiting for the database: %d %s, want 503 naming the wait\n%s", code, body, stderr.String())
	}
	standby.Promote(t)
	deadline := time.Now().Add(60 * time.Second)
	for {
		code, body := get("/readyz")
		if code == http.StatusOK && strings.Contains(body, `"leader":true`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz = %d %s 60 s after the promotion\n%s", code, body, stderr.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// `kafkatx relay` whose brokers are all unreachable answered /readyz 200 while its outbox was
// empty (a fresh-eyes attack: nothing written would have been published). /readyz is 503 with
// a reason naming Kafka once the brokers have been down for relay.NotReadyAfter, and 200 again
// once one answers.
func TestRelayCommandIsNotReadyWhileKafkaIsUnreachable(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	brokers := testenv.Brokers(t)
	kafkaAddr, healthAddr := testenv.FreeAddr(t), testenv.FreeAddr(t)
	cli := buildCLI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, cli, "relay", "--migrate", "--schema", schema, "--brokers", kafkaAddr,
		"--database-url", testenv.DatabaseURL(t), "--health-addr", healthAddr)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill() //nolint:errcheck
	waitBody := func(what string, ok func(code int, body string) bool) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			code, body := testenv.Get(healthAddr, "/readyz")
			if ok(code, body) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("/readyz = %d %s; want %s\n%s", code, body, what, stderr.String())
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	waitBody("503 naming Kafka", func(code int, body string) bool {
		return code == http.StatusServiceUnavailable && strings.Contains(body, "Kafka unreachable since") && strings.Contains(body, `"leader":true`)
	})
	testenv.Forward(t, kafkaAddr, strings.Split(brokers, ",")[0])
	waitBody("200 once a broker answers", func(code int, body string) bool { return code == http.StatusOK })
}

// In WAL mode a second `kafkatx relay` waits for the slot the first streams. Its /readyz
// answered 503 with no reason, then after 10 s "cannot publish", for as long as the first ran:
// a standby read as a failure (a rollout of two replicas never completed). Now a standby is
// ready with "standby":true, as a table relay's standby is, past walrelay.NotReadyAfter too.
func TestWALRelayStandbyIsReady(t *testing.T) {
	t.Parallel()
	bin := buildCLI(t)
	dsn := testenv.Database(t)
	brokers := testenv.Brokers(t)
	t.Cleanup(func() {
		_, _, _ = runCLI(t, bin, "--database-url", dsn, "outbox", "drop-slot", "--force")
	})
	if out, stderr, code := runCLI(t, bin, "--database-url", dsn, "migrate", "up", "--outbox-mode", "wal"); code != 0 {
		t.Fatalf("migrate up --outbox-mode wal: exit %d, %q %q", code, out, stderr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	start := func() (string, *bytes.Buffer) {
		addr := testenv.FreeAddr(t)
		cmd := exec.CommandContext(ctx, bin, "relay", "--brokers", brokers, "--database-url", dsn, "--health-addr", addr)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return addr, &stderr
	}
	waitFor := func(addr string, stderr *bytes.Buffer, want string) string {
		deadline := time.Now().Add(60 * time.Second)
		for {
			code, body := testenv.Get(addr, "/readyz")
			if code == http.StatusOK && strings.Contains(body, want) {
				return body
			}
			if time.Now().After(deadline) {
				t.Fatalf("/readyz = %d %s, want 200 with %s\n%s", code, body, want, stderr.String())
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	first, firstErr := start()
	waitFor(first, firstErr, `"leader":true`)
	second, secondErr := start()
	waitFor(second, secondErr, `"standby":true`)
	time.Sleep(walrelay.NotReadyAfter + 2*time.Second)
	if code, body := testenv.Get(second, "/readyz"); code != http.StatusOK || !strings.Contains(body, `"standby":true`) || strings.Contains(body, `"reason"`) {
		t.Fatalf("the standby's /readyz %s after it started: %d %s, want 200, standby, no reason\n%s", walrelay.NotReadyAfter+2*time.Second, code, body, secondErr.String())
	}
	if code, body := testenv.Get(first, "/readyz"); code != http.StatusOK || strings.Contains(body, `"reason"`) {
		t.Fatalf("the streaming relay's /readyz: %d %s, want 200 without a reason", code, body)
	}
}
