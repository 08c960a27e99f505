package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/dlq"
	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

// `kafkatx relay` publishes a row inserted with plain SQL when its NOTIFY arrives (polling is
// set to an hour, so nothing else publishes it within the test's waits), serves /readyz and
// /metrics, never prints a secret from its config file, and on SIGTERM exits 0 with its
// summary line.
func TestRelayCommandPublishesPlainSQLRowsAndStopsOnSIGTERM(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	brokers := testenv.Brokers(t)
	topic := testenv.TopicWithConfig(t, brokers, 3, map[string]string{"message.timestamp.type": "LogAppendTime"})
	ctx := context.Background()
	if _, err := migrations.Apply(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	cli := buildCLI(t)
	const secret = "S3cr3t-do-not-log-8f2a"
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "kafka.properties")
	if err := os.WriteFile(cfgFile, []byte("# test\nclient.id=relay-test\nsasl.password="+secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := testenv.FreeAddr(t)
	cmd := exec.Command(cli, "relay", "--schema", schema, "--brokers", brokers, "--database-url", testenv.DatabaseURL(t),
		"--kafka-config-file", cfgFile, "--health-addr", addr, "--log-level", "debug", "--poll-interval", "1h")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill() //nolint:errcheck

	get := func(path string) (int, string) { return testenv.Get(addr, path) }
	deadline := time.Now().Add(60 * time.Second)
	for {
		code, body := get("/readyz")
		if code == 200 && strings.Contains(body, `"leader":true`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz = %d %s; stderr:\n%s", code, body, stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("/healthz = %d", code)
	}

	start := time.Now()
	if _, err := pool.Exec(ctx, `INSERT INTO `+pgx.Identifier{schema, "outbox"}.Sanitize()+` (topic, key, value) VALUES ($1, 'k1'::bytea, 'hello from sql'::bytea)`, topic); err != nil {
		t.Fatal(err)
	}
	at := waitRecord(t, brokers, topic, 60*time.Second)
	t.Logf("published %s after the insert (broker append time), woken by its NOTIFY", at.Sub(start).Round(time.Millisecond))
	if _, body := get("/metrics"); !strings.Contains(body, `kafkatx_outbox_published_total{schema="`+schema+`",topic="`+topic+`"} 1`) {
		t.Fatalf("/metrics lacks the published counter:\n%s", body)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("relay exited with %v; stderr:\n%s", err, stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatal("relay did not exit within 60s of SIGTERM")
	}
	if got := strings.TrimSpace(stdout.String()); got != `{"parked":0,"published":1,"retried":0}` {
		t.Fatalf("stdout %q", got)
	}
	if strings.Contains(stderr.String()+stdout.String(), secret) {
		t.Fatal("the secret from the Kafka config file appears in the output")
	}
}

// --exit-when-idle: the sidecar exits 0 by itself once the outbox stays empty that long.
func TestRelayCommandExitsWhenIdle(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	brokers := testenv.Brokers(t)
	topic := testenv.Topic(t, brokers, 1)
	ctx := context.Background()
	if _, err := migrations.Apply(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+pgx.Identifier{schema, "outbox"}.Sanitize()+` (topic, key, value)
		SELECT $1, NULL, convert_to('v' || g, 'UTF8') FROM generate_series(1, 50) g`, topic); err != nil {
		t.Fatal(err)
	}
	cli := buildCLI(t)
	cmd := exec.Command(cli, "relay", "--schema", schema, "--brokers", brokers, "--database-url", testenv.DatabaseURL(t), "--exit-when-idle", "1s")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("relay --exit-when-idle: %v", err)
	}
	if got := strings.TrimSpace(string(out)); got != `{"parked":0,"published":50,"retried":0}` {
		t.Fatalf("stdout %q", got)
	}
}

// waitRecord waits for the first record of topic and returns its timestamp.
func waitRecord(t *testing.T, brokers, topic string, timeout time.Duration) time.Time {
	t.Helper()
	c, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": brokers, "group.id": testenv.Group(t),
		"auto.offset.reset": "earliest", "enable.auto.commit": false})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Subscribe(topic, nil); err != nil {
		t.Fatal(err)
	}
	m, err := c.ReadMessage(timeout)
	if err != nil {
		t.Fatalf("no record in %s within %s: %v", topic, timeout, err)
	}
	return m.Timestamp
}

// dlq list and show summarize values (size, sha256, short prefix) unless --show-value; replay
// and discard are audited and refuse a resolved dead letter with exit status 6.
func TestDLQCommands(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	ctx := context.Background()
	if _, err := migrations.Apply(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	const private = "customer-email=jane@example.com"
	value := []byte("0123456789abcdefghijklmnopqrstuvwxyz " + private)
	var id int64
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		id, _, err = dlq.InsertTx(ctx, tx, schema, &dlq.DeadLetter{Group: "g", Topic: "orders", Partition: 1, Offset: 7,
			Value: value, Headers: []dlq.Header{{Key: "h", Value: []byte(private)}}, ErrorClass: "permanent", ErrorMessage: "bad",
			Attempts: 1, FirstFailureAt: time.Now(), LastFailureAt: time.Now()})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	cli := buildCLI(t)
	run := func(args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(cli, append([]string{"--schema", schema, "--database-url", testenv.DatabaseURL(t)}, args...)...)
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), code
	}
	sid := fmt.Sprint(id)
	for _, args := range [][]string{{"dlq", "list"}, {"dlq", "list", "--output", "json"}, {"dlq", "show", sid}, {"dlq", "show", sid, "--output", "json"}} {
		out, code := run(args...)
		if code != 0 || strings.Contains(out, private) || !strings.Contains(out, "0123456789") {
			t.Fatalf("%v (exit %d) shows the value in full or not at all:\n%s", args, code, out)
		}
	}
	var j dlqJSON
	out, _ := run("dlq", "show", sid, "--output", "json", "--show-value")
	if err := json.Unmarshal([]byte(out), &j); err != nil || !strings.Contains(j.Value.Full, private) || j.Value.Size != len(value) {
		t.Fatalf("show --show-value: %v\n%s", err, out)
	}
	if out, code := run("dlq", "replay", sid); code == 0 {
		t.Fatalf("replay without --reason succeeded:\n%s", out)
	}
	if out, code := run("dlq", "replay", sid, "--reason", "fixed", "--to-topic", "orders-retry"); code != 0 || !strings.Contains(out, "outbox row") {
		t.Fatalf("replay: exit %d\n%s", code, out)
	}
	if out, code := run("dlq", "discard", sid, "--reason", "late"); code != exitNotActionable {
		t.Fatalf("discard of a replayed dead letter: exit %d, want %d\n%s", code, exitNotActionable, out)
	}
	var topic string
	var replayed int
	if err := pool.QueryRow(ctx, `SELECT o.topic, count(*) OVER () FROM `+pgx.Identifier{schema, "outbox"}.Sanitize()+` o
		JOIN `+pgx.Identifier{schema, "dlq_audit"}.Sanitize()+` a ON a.outbox_row = o.id WHERE a.dead_letter_id = $1 AND a.reason = 'fixed'`, id).Scan(&topic, &replayed); err != nil {
		t.Fatal(err)
	}
	if topic != "orders-retry" || replayed != 1 {
		t.Fatalf("replay wrote %d outbox rows to %s", replayed, topic)
	}
	if out, code := run("dlq", "show", "999999"); code != exitNotActionable {
		t.Fatalf("show of a missing dead letter: exit %d\n%s", code, out)
	}
}
