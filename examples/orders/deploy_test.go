package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// buildOrders returns this command built once for every test of the package (testenv.BuildOnce).
func buildOrders(t *testing.T) string {
	t.Helper()
	return testenv.BuildOnce(t, ".", "orders")
}

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.RemoveBuilds()
	os.Exit(code)
}

type runResult struct {
	stdout, stderr string
	code           int
	took           time.Duration
}

func runOrders(t *testing.T, bin string, timeout time.Duration, args ...string) runResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	start := time.Now()
	err := cmd.Run()
	r := runResult{stdout: out.String(), stderr: errOut.String(), took: time.Since(start)}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		t.Fatalf("orders %v: %v", args, err)
	}
	if ctx.Err() != nil {
		t.Fatalf("orders %v did not end within %s; stderr:\n%s", args, timeout, r.stderr)
	}
	return r
}

// highWatermarks sums the end offsets of topic's partitions (over PLAINTEXT).
func highWatermarks(t *testing.T, brokers, topic string) int64 {
	t.Helper()
	c, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": brokers, "group.id": "hw-" + topic})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	md, err := c.GetMetadata(&topic, false, 10000)
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	for _, p := range md.Topics[topic].Partitions {
		_, hi, err := c.QueryWatermarkOffsets(topic, p.ID, 10000)
		if err != nil {
			t.Fatal(err)
		}
		sum += hi
	}
	return sum
}

// The order service as deployed: Kafka over the SASL_SSL listener (ACLs enforced), PostgreSQL
// through PgBouncer in transaction mode with --session-database-url for migrations and the
// relay's leadership. Exact effects, every dead letter and event published by the relay;
// without --session-database-url it refuses (never a session lock through the pooler); a wrong
// password ends it non-zero with a line about authentication; no password in any output.
func TestOrdersOverSASLSSLThroughPgBouncer(t *testing.T) {
	t.Parallel()
	sb, props, cfgFile := testenv.SecureKafka(t)
	password := fmt.Sprint(props["sasl.password"])
	plain := testenv.Brokers(t)
	direct := testenv.Database(t)
	pooled := testenv.ThroughPgBouncer(t, direct)
	bin := buildOrders(t)
	topic := testenv.UniqueName(t, "dep-", 100)
	events := topic + ".events"
	common := []string{"--brokers", sb, "--kafka-config-file", cfgFile, "--topic", topic, "--group", topic, "--events-topic", events}
	t.Cleanup(func() {
		a, err := kafka.NewAdminClient(&kafka.ConfigMap{"bootstrap.servers": plain})
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			_, _ = a.DeleteTopics(ctx, []string{topic, topic + ".dlq", events})
			cancel()
			a.Close()
		}
	})
	var outputs []string

	p := runOrders(t, bin, 60*time.Second, append(common, "--generate", "2000", "--poison-every", "100", "--produce-only")...)
	outputs = append(outputs, p.stdout, p.stderr)
	var prod struct{ Valid, Poison, TotalCents int64 }
	if err := json.Unmarshal([]byte(strings.TrimSpace(p.stdout)), &struct {
		Valid      *int64 `json:"valid"`
		Poison     *int64 `json:"poison"`
		TotalCents *int64 `json:"total_cents"`
	}{&prod.Valid, &prod.Poison, &prod.TotalCents}); p.code != 0 || err != nil || prod.Valid != 1980 {
		t.Fatalf("produce over SASL_SSL: exit %d, %v, stdout %q stderr:\n%s", p.code, err, p.stdout, p.stderr)
	}

	// Without a session URL the migrations' lock would go through the pooler: refused.
	r := runOrders(t, bin, 60*time.Second, append(common, "--database-url", pooled, "--exit-when-idle", "3s")...)
	outputs = append(outputs, r.stdout, r.stderr)
	if r.code == 0 || !strings.Contains(r.stderr, "transaction pooler") {
		t.Fatalf("through PgBouncer without --session-database-url: exit %d, want non-zero naming the transaction pooler; stderr:\n%s", r.code, r.stderr)
	}

	c := runOrders(t, bin, 180*time.Second, append(common, "--database-url", pooled, "--session-database-url", direct, "--exit-when-idle", "3s")...)
	outputs = append(outputs, c.stdout, c.stderr)
	if c.code != 0 {
		t.Fatalf("drain over SASL_SSL through PgBouncer: exit %d; stderr:\n%s", c.code, c.stderr)
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, direct)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var orders, cents, dead, pending int64
	if err := pool.QueryRow(ctx, `SELECT (SELECT sum(orders) FROM customer_totals), (SELECT sum(total_cents) FROM customer_totals),
		(SELECT count(*) FROM kafkatx.dead_letters), (SELECT coalesce(sum(pack_count), 0) FROM kafkatx.outbox WHERE state IN ('pending', 'parked', 'packed'))`).Scan(&orders, &cents, &dead, &pending); err != nil {
		t.Fatal(err)
	}
	if orders != 1980 || cents != prod.TotalCents || dead != 20 || pending != 0 {
		t.Fatalf("orders %d (want 1980), cents %d (want %d), dead letters %d (want 20), outbox pending %d (want 0)", orders, cents, prod.TotalCents, dead, pending)
	}
	if n := highWatermarks(t, plain, events); n != 1980 {
		t.Fatalf("%d events published by the relay over SASL_SSL, want 1980", n)
	}
	if n := highWatermarks(t, plain, topic+".dlq"); n != 20 {
		t.Fatalf("%d dead letters published, want 20", n)
	}

	bad := filepath.Join(t.TempDir(), "bad.properties")
	raw, err := os.ReadFile(cfgFile)
	if err != nil {
		t.Fatal(err)
	}
	wrong := regexp.MustCompile(`(?m)^sasl\.password=.*$`).ReplaceAllString(string(raw), "sasl.password=wrong-"+password)
	if err := os.WriteFile(bad, []byte(wrong), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"--brokers", sb, "--kafka-config-file", bad, "--topic", topic, "--group", topic, "--events-topic", events,
		"--database-url", pooled, "--session-database-url", direct, "--exit-when-idle", "3s"}
	w := runOrders(t, bin, 90*time.Second, args...)
	outputs = append(outputs, w.stdout, w.stderr)
	// The exit line itself names the failure: it said "(is it reachable?): context deadline
	// exceeded" while librdkafka's log lines above it said "Authentication failed".
	lines := strings.Split(strings.TrimSpace(w.stderr), "\n")
	if last := lines[len(lines)-1]; w.code == 0 || !strings.Contains(last, "authentication failed") || strings.Contains(last, "deadline") || w.took > 75*time.Second {
		t.Fatalf("a wrong SASL password: exit %d after %s, want non-zero within 75 s, its last line naming the authentication failure; stderr tail:\n%s", w.code, w.took, tail(w.stderr))
	}
	for _, o := range outputs {
		if strings.Contains(o, password) {
			t.Fatal("the SASL password appears in the service's output")
		}
	}
	t.Logf("wrong password: exit %d after %s", w.code, w.took.Round(time.Second))
}

func tail(s string) string {
	if len(s) > 3000 {
		return s[len(s)-3000:]
	}
	return s
}
