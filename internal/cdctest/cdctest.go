// Package cdctest runs a real Debezium PostgreSQL connector for tests: it registers
// connectors on the Kafka Connect worker that `scripts/dev-services up connect` starts
// (KAFKA_CONNECT_URL), waits for their task, kills the worker with SIGKILL and starts it again
// through the same script, and removes what a test made (the connector, its replication slot,
// its topics).
//
// A test that needs Connect calls ConnectURL first: without KAFKA_CONNECT_URL, or when the
// worker does not answer, the test fails under CI=true (make test sets it) and is skipped
// otherwise, like the services of internal/testenv.
package cdctest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// EnvConnectURL names Kafka Connect's REST address, e.g. http://127.0.0.1:8083.
const EnvConnectURL = "KAFKA_CONNECT_URL"

// ConnectURL returns KAFKA_CONNECT_URL after checking that the worker answers GET /; it
// stops the test (testenv.Unavailable: a failure in CI) otherwise.
func ConnectURL(t testing.TB) string {
	t.Helper()
	testenv.FullTier(t, "needs Kafka Connect with Debezium (scripts/dev-services up connect)")
	u := os.Getenv(EnvConnectURL)
	if u == "" {
		testenv.Unavailable(t, "%s is not set (scripts/dev-services up connect)", EnvConnectURL)
	}
	if err := answers(u); err != nil {
		testenv.Unavailable(t, "Kafka Connect at %s=%s does not answer: %v", EnvConnectURL, u, err)
	}
	return strings.TrimRight(u, "/")
}

func answers(u string) error {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(u + "/")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET / answered %s", resp.Status)
	}
	return nil
}

// Config returns a connector configuration reading the database of dsn (a postgres:// URL)
// with pgoutput through its own slot and publication, writing topics "<prefix>.<schema>.<table>"
// (created by Connect, 1 partition), JSON keys with schemas and JSON values without. tables
// are "schema.table" names for table.include.list. Callers add or override settings.
func Config(t testing.TB, dsn, prefix string, tables ...string) map[string]string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("cdctest: parse %s: %v", dsn, err)
	}
	pw, _ := u.User.Password()
	slot := strings.ReplaceAll(prefix, "-", "_")
	return map[string]string{
		"connector.class":                "io.debezium.connector.postgresql.PostgresConnector",
		"tasks.max":                      "1",
		"plugin.name":                    "pgoutput",
		"database.hostname":              u.Hostname(),
		"database.port":                  u.Port(),
		"database.user":                  u.User.Username(),
		"database.password":              pw,
		"database.dbname":                strings.TrimPrefix(u.Path, "/"),
		"topic.prefix":                   prefix,
		"slot.name":                      slot,
		"publication.name":               slot + "_pub",
		"publication.autocreate.mode":    "filtered",
		"table.include.list":             strings.Join(tables, ","),
		"key.converter":                  "org.apache.kafka.connect.json.JsonConverter",
		"key.converter.schemas.enable":   "true",
		"value.converter":                "org.apache.kafka.connect.json.JsonConverter",
		"value.converter.schemas.enable": "false",
		// A restarted worker finds the slot still held by the killed one's walsender for a
		// moment: retry every second (default 10 s).
		"slot.retry.delay.ms":                       "1000",
		"slot.max.retries":                          "60",
		"topic.creation.default.partitions":         "1",
		"topic.creation.default.replication.factor": "1",
	}
}

// Connector is a connector a test registered.
type Connector struct {
	URL, Name string
	Config    map[string]string
	dsn       string
}

// Start registers a connector named name with cfg (see Config) and waits until its task
// runs. When the test ends the connector is deleted, its replication slot dropped and the
// topics under its topic.prefix deleted (brokers: KAFKA_BOOTSTRAP_SERVERS).
func Start(t testing.TB, dsn, name string, cfg map[string]string) *Connector {
	t.Helper()
	c := &Connector{URL: ConnectURL(t), Name: name, Config: cfg, dsn: dsn}
	t.Cleanup(func() { c.remove(t) })
	c.Register(t)
	return c
}

// Register (re-)creates the connector with its Config, as after a restart of a standalone
// worker (which keeps offsets, not connectors), and waits until its task runs.
func (c *Connector) Register(t testing.TB) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"name": c.Name, "config": c.Config})
	if code, out := c.do(t, http.MethodPost, "/connectors", body); code != http.StatusCreated && code != http.StatusConflict {
		t.Fatalf("cdctest: POST /connectors %s: %d %s", c.Name, code, out)
	}
	c.WaitRunning(t, 3*time.Minute)
}

// Update replaces the connector's configuration (PUT /connectors/NAME/config) and waits
// until its task runs again.
func (c *Connector) Update(t testing.TB, cfg map[string]string) {
	t.Helper()
	c.Config = cfg
	body, _ := json.Marshal(cfg)
	if code, out := c.do(t, http.MethodPut, "/connectors/"+c.Name+"/config", body); code != http.StatusOK && code != http.StatusCreated {
		t.Fatalf("cdctest: PUT config %s: %d %s", c.Name, code, out)
	}
	time.Sleep(time.Second) // the old task stops first
	c.WaitRunning(t, 3*time.Minute)
}

// WaitRunning waits until the connector's task reports RUNNING; a FAILED task, or none
// within timeout, fails the test with the task's trace.
func (c *Connector) WaitRunning(t testing.TB, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		code, out := c.do(t, http.MethodGet, "/connectors/"+c.Name+"/status", nil)
		last = string(out)
		if code == http.StatusOK {
			var st struct {
				Tasks []struct {
					State string `json:"state"`
					Trace string `json:"trace"`
				} `json:"tasks"`
			}
			_ = json.Unmarshal(out, &st)
			if len(st.Tasks) > 0 && st.Tasks[0].State == "RUNNING" {
				return
			}
			if len(st.Tasks) > 0 && st.Tasks[0].State == "FAILED" {
				t.Fatalf("cdctest: connector %s task FAILED: %.3000s", c.Name, st.Tasks[0].Trace)
			}
		}
		time.Sleep(300 * time.Millisecond)
	}
	t.Fatalf("cdctest: connector %s not RUNNING within %s: %.2000s", c.Name, timeout, last)
}

func (c *Connector) do(t testing.TB, method, path string, body []byte) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, c.URL+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	hc := http.Client{Timeout: 60 * time.Second}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

// remove deletes the connector, drops its slot (once the task let go of it) and deletes its
// topics. Failures are logged: the database and topics are unique per test.
func (c *Connector) remove(t testing.TB) {
	req, _ := http.NewRequest(http.MethodDelete, c.URL+"/connectors/"+c.Name, nil)
	hc := http.Client{Timeout: 60 * time.Second}
	if resp, err := hc.Do(req); err == nil {
		resp.Body.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	slot := c.Config["slot.name"]
	conn, err := pgx.Connect(ctx, c.dsn)
	if err != nil {
		t.Logf("cdctest: drop slot %s: %v", slot, err)
	} else {
		defer conn.Close(ctx)
		for {
			var n int
			err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&n)
			if err == nil && n == 0 {
				break
			}
			if err == nil {
				_, err = conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active`, slot)
			}
			if ctx.Err() != nil {
				t.Logf("cdctest: replication slot %s not dropped: %v", slot, err)
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	if brokers := os.Getenv(testenv.EnvBootstrap); brokers != "" {
		deleteTopics(t, brokers, c.Config["topic.prefix"])
	}
}

func deleteTopics(t testing.TB, brokers, prefix string) {
	admin, err := kafka.NewAdminClient(&kafka.ConfigMap{"bootstrap.servers": brokers})
	if err != nil {
		return
	}
	defer admin.Close()
	md, err := admin.GetMetadata(nil, true, 10000)
	if err != nil {
		return
	}
	var names []string
	for name := range md.Topics {
		if strings.HasPrefix(name, prefix+".") || name == "__debezium-heartbeat."+prefix {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := admin.DeleteTopics(ctx, names); err != nil {
		t.Logf("cdctest: delete topics %v: %v", names, err)
	}
}

// WaitTopic waits until topic exists on brokers.
func WaitTopic(t testing.TB, brokers, topic string, timeout time.Duration) {
	t.Helper()
	admin, err := kafka.NewAdminClient(&kafka.ConfigMap{"bootstrap.servers": brokers})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		md, err := admin.GetMetadata(&topic, false, 5000)
		if err == nil {
			if tm, ok := md.Topics[topic]; ok && tm.Error.Code() == kafka.ErrNoError && len(tm.Partitions) > 0 {
				return
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("cdctest: topic %s not created within %s", topic, timeout)
}

// EndOffset returns the sum of topic's partitions' high watermarks: the records written to
// it (no compaction, no transactions).
func EndOffset(t testing.TB, brokers, topic string) int64 {
	t.Helper()
	c, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": brokers, "group.id": "cdctest-watermarks"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	md, err := c.GetMetadata(&topic, false, 10000)
	if err != nil {
		t.Fatalf("cdctest: metadata of %s: %v", topic, err)
	}
	var n int64
	for _, p := range md.Topics[topic].Partitions {
		_, hi, err := c.QueryWatermarkOffsets(topic, p.ID, 10000)
		if err != nil {
			t.Fatalf("cdctest: watermarks of %s/%d: %v", topic, p.ID, err)
		}
		n += hi
	}
	return n
}

// WaitEndOffset waits until topic holds at least n records and returns how many it holds.
func WaitEndOffset(t testing.TB, brokers, topic string, n int64, timeout time.Duration) int64 {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		got := EndOffset(t, brokers, topic)
		if got >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("cdctest: %s holds %d records after %s, want at least %d", topic, got, timeout, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Worker returns the PID of the Connect worker scripts/dev-services started, from its status
// line "connect: running at URL (pid N)".
func Worker(t testing.TB) int {
	t.Helper()
	out, _ := devServices(t, "status", "connect")
	m := regexp.MustCompile(`connect: running at \S+ \(pid (\d+)\)`).FindStringSubmatch(out)
	if m == nil {
		testenv.Unavailable(t, "no Kafka Connect worker started by scripts/dev-services: %s", out)
	}
	pid, _ := strconv.Atoi(m[1])
	return pid
}

// KillWorker kills the Connect worker with SIGKILL and waits until it is gone.
func KillWorker(t testing.TB) {
	t.Helper()
	pid := Worker(t)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("cdctest: kill -9 %d: %v", pid, err)
	}
	for i := 0; i < 100; i++ {
		if syscall.Kill(pid, 0) != nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("cdctest: Connect worker %d still alive after SIGKILL", pid)
}

// StartWorker starts the Connect worker again (scripts/dev-services up connect), which
// resumes from the offsets file the killed one left; re-register connectors afterwards.
func StartWorker(t testing.TB) {
	t.Helper()
	if out, err := devServices(t, "up", "connect"); err != nil {
		t.Fatalf("cdctest: scripts/dev-services up connect: %v\n%s", err, out)
	}
}

func devServices(t testing.TB, args ...string) (string, error) {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(root, "scripts", "dev-services"), args...)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	return string(out), err
}
