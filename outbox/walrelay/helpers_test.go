package walrelay

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
)

// Environment of the relay child process (the test binary run again, see TestMain).
const (
	envChild           = "KAFKATX_WALRELAY_CHILD" // the database URL
	envChildCheckpoint = "KAFKATX_WALRELAY_CHILD_CHECKPOINT"
)

func TestMain(m *testing.M) {
	if dsn := os.Getenv(envChild); dsn != "" {
		os.Exit(childMain(dsn))
	}
	os.Exit(m.Run())
}

// childMain runs a WAL relay until SIGTERM (or a crash point's SIGKILL, hooks.go). It prints
// "STREAMING" once it streams.
func childMain(dsn string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer pool.Close()
	log, _ := zap.NewDevelopment()
	r, err := New(pool, Config{Kafka: kafka.ConfigMap{"bootstrap.servers": os.Getenv(testenv.EnvBootstrap)},
		Replication: pool.Config().ConnConfig, CheckpointTopic: os.Getenv(envChildCheckpoint), Logger: log,
		RetryInterval: 100 * time.Millisecond, Linger: 5 * time.Millisecond})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	go func() {
		for ctx.Err() == nil && !r.Stats().Streaming {
			time.Sleep(10 * time.Millisecond)
		}
		fmt.Println("STREAMING")
	}()
	if err := r.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// bundle is one test's database in WAL mode, its topics and brokers.
type bundle struct {
	dsn, brokers, topic, checkpoint string
	pool                            *pgxpool.Pool
	slot                            string
}

// newBundle makes a fresh database with kafkatx's schema in WAL mode (slot and publication
// created), a 3-partition topic and a checkpoint topic; the slot is dropped when the test
// ends (before the database).
func newBundle(t *testing.T) *bundle {
	t.Helper()
	brokers := testenv.Brokers(t)
	return newBundleOn(t, brokers, testenv.Database(t))
}

// newBundleOn is newBundle on the database dsn names.
func newBundleOn(t *testing.T, brokers, dsn string) *bundle {
	t.Helper()
	b := &bundle{brokers: brokers, dsn: dsn}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, b.dsn)
	if err != nil {
		t.Fatal(err)
	}
	b.pool = pool
	t.Cleanup(func() {
		if b.slot != "" {
			for i := 0; i < 50; i++ { // a killed relay's walsender may hold it a moment
				_, _ = pool.Exec(context.Background(), `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, b.slot)
				_, err := pool.Exec(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, b.slot)
				if err == nil {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
		pool.Close()
	})
	if _, err := migrations.Apply(ctx, pool, "kafkatx"); err != nil {
		t.Fatal(err)
	}
	if err := outbox.SetMode(ctx, pool, "kafkatx", outbox.ModeWAL); err != nil {
		t.Fatal(err)
	}
	s, err := outbox.ReadSettings(ctx, pool, "kafkatx")
	if err != nil {
		t.Fatal(err)
	}
	b.slot = s.Slot
	b.topic = testenv.Topic(t, b.brokers, 3)
	b.checkpoint = testenv.TopicWithConfig(t, b.brokers, 1, map[string]string{"cleanup.policy": "compact"})
	return b
}

func (b *bundle) config(t *testing.T) Config {
	return Config{Kafka: kafka.ConfigMap{"bootstrap.servers": b.brokers}, Replication: b.pool.Config().ConnConfig,
		CheckpointTopic: b.checkpoint, Logger: zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)),
		RetryInterval: 100 * time.Millisecond, Linger: 5 * time.Millisecond}
}

// start runs a relay in this process until the test ends.
func (b *bundle) start(t *testing.T, cfg Config) (*Relay, context.CancelFunc, chan error) {
	t.Helper()
	r, err := New(b.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return r, cancel, done
}

// write commits one transaction writing n keyed records (key "k<i mod keys>", value
// "<tag>-<i>") through outbox.WriteTx.
func (b *bundle) write(t *testing.T, tag string, n, keys int) {
	t.Helper()
	recs := make([]outbox.Record, n)
	for i := range recs {
		recs[i] = outbox.Record{Topic: b.topic, Key: []byte("k" + strconv.Itoa(i%keys)), Value: []byte(tag + "-" + strconv.Itoa(i))}
	}
	err := pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
		_, err := outbox.WriteTx(context.Background(), tx, recs...)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// readAll reads topic read_committed from the beginning until want records arrived and then
// nothing more for quiet (or timeout passes), and returns them.
func readAll(t *testing.T, brokers, topic string, want int, quiet, timeout time.Duration) []*kafka.Message {
	t.Helper()
	c, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": brokers, "group.id": "walreader-" + strconv.FormatInt(time.Now().UnixNano(), 36),
		"auto.offset.reset": "earliest", "isolation.level": "read_committed", "enable.auto.commit": false, "go.logs.channel.enable": false})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Subscribe(topic, nil); err != nil {
		t.Fatal(err)
	}
	var out []*kafka.Message
	end := time.Now().Add(timeout)
	last := time.Now()
	for time.Now().Before(end) {
		m, err := c.ReadMessage(100 * time.Millisecond)
		if err == nil {
			out = append(out, m)
			last = time.Now()
			continue
		}
		if len(out) >= want && time.Since(last) >= quiet {
			break
		}
	}
	return out
}

// onceEach checks that msgs hold exactly the values want, each once, and per key in the order
// of want.
func onceEach(t *testing.T, msgs []*kafka.Message, want []string) {
	t.Helper()
	seen := map[string]int{}
	ids := map[string]bool{}
	perKey := map[string][]string{}
	for _, m := range msgs {
		seen[string(m.Value)]++
		perKey[string(m.Key)] = append(perKey[string(m.Key)], string(m.Value))
		var id string
		for _, h := range m.Headers {
			if h.Key == outbox.HeaderOutboxID {
				id = string(h.Value)
			}
		}
		if id == "" || ids[id] {
			t.Fatalf("record %q: outbox id %q missing or repeated", m.Value, id)
		}
		ids[id] = true
	}
	dups, missing := 0, 0
	for _, w := range want {
		switch seen[w] {
		case 0:
			missing++
		case 1:
		default:
			dups++
		}
	}
	if dups > 0 || missing > 0 || len(msgs) != len(want) {
		t.Fatalf("%d records read for %d written: %d written more than once, %d missing", len(msgs), len(want), dups, missing)
	}
	_ = perKey
}

// child is a relay process (the test binary run again).
type child struct {
	cmd   *exec.Cmd
	lines chan string
	done  chan struct{}
}

func (b *bundle) startChild(t *testing.T, crashAt string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChild+"="+b.dsn, envChildCheckpoint+"="+b.checkpoint, testenv.EnvBootstrap+"="+b.brokers,
		"KAFKATX_WALRELAY_CRASH_AT="+crashAt)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	logf, err := os.CreateTemp(t.TempDir(), "walrelay-*.log")
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, lines: make(chan string, 100), done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
		_ = cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-c.done
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			t.Logf("relay child (pid %d, crash at %q) log tail:\n%s", cmd.Process.Pid, crashAt, b)
		}
	})
	return c
}

// exited waits up to d for the child to end and reports whether it was killed by SIGKILL.
func (c *child) killedWithin(d time.Duration) bool {
	select {
	case <-c.done:
		ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus)
		return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
	case <-time.After(d):
		return false
	}
}

func values(tag string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = tag + "-" + strconv.Itoa(i)
	}
	return out
}

var _ = strings.TrimSpace
