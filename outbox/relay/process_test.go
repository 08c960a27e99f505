package relay

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
)

// Environment of the relay child process (the test binary run again, see TestMain).
const (
	envChild       = "KAFKATX_RELAY_CHILD" // "run", "hang-before-mark" or "stop-in-mark"
	envChildSchema = "KAFKATX_RELAY_CHILD_SCHEMA"
	envChildLeader = "KAFKATX_RELAY_CHILD_LEADER_TIMEOUT" // Config.LeaderTimeout (time.ParseDuration)
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(envChild); mode != "" {
		os.Exit(childMain(mode))
	}
	os.Exit(m.Run())
}

// childMain runs a relay in this process until SIGTERM. It prints "LEADER" once it leads
// and, in mode hang-before-mark, "DELIVERED n" after its first round's delivery reports,
// then hangs before marking the rows, waiting to be killed.
func childMain(mode string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv(testenv.EnvDatabaseURL))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer pool.Close()
	log, _ := zap.NewDevelopment()
	var printMu sync.Mutex
	say := func(s string) {
		printMu.Lock()
		defer printMu.Unlock()
		fmt.Println(s)
		os.Stdout.Sync() //nolint:errcheck
	}
	leaderTimeout, _ := time.ParseDuration(os.Getenv(envChildLeader))
	r, err := New(pool, &Config{Kafka: kafka.ConfigMap{"bootstrap.servers": os.Getenv(testenv.EnvBootstrap)},
		Schema: os.Getenv(envChildSchema), Logger: log, PollInterval: 200 * time.Millisecond, StandbyInterval: 200 * time.Millisecond,
		KeepPublished: time.Hour, LeaderTimeout: leaderTimeout})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if mode == "stop-in-mark" {
		var once sync.Once
		r.signals.inMark = func() {
			once.Do(func() {
				say("IN MARK")
				time.Sleep(time.Hour) // the mark's transaction stays open; the test freezes the process
			})
		}
	}
	if mode == "hang-before-mark" {
		r.signals.beforeMark = func(results []result) {
			n := 0
			for _, r := range results {
				if r.outcome == outcomeDelivered {
					n++
				}
			}
			say(fmt.Sprintf("DELIVERED %d", n))
			select {}
		}
	}
	go func() {
		for ctx.Err() == nil && !r.Stats().Leader {
			time.Sleep(10 * time.Millisecond)
		}
		if ctx.Err() == nil {
			say("LEADER")
		}
	}()
	if err := r.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// child is a relay process started by a test.
type child struct {
	cmd   *exec.Cmd
	lines chan string
}

func (b *testBundle) startChild(t *testing.T, mode string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), envChild+"="+mode, envChildSchema+"="+b.schema,
		testenv.EnvBootstrap+"="+b.brokers), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	logf, err := os.CreateTemp(t.TempDir(), "relay-*.log")
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, lines: make(chan string, 100)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("relay child (pid %d) log:\n%s", cmd.Process.Pid, b)
		}
	})
	return c
}

// expect waits for a line starting with prefix and returns it.
func (c *child) expect(t *testing.T, prefix string, timeout time.Duration) string {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				t.Fatalf("relay child exited before printing %q", prefix)
			}
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-deadline:
			t.Fatalf("relay child did not print %q within %s", prefix, timeout)
		}
	}
}

// printed reports whether the child printed a line starting with prefix within d.
func (c *child) printed(prefix string, d time.Duration) bool {
	deadline := time.After(d)
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				return false
			}
			if strings.HasPrefix(l, prefix) {
				return true
			}
		case <-deadline:
			return false
		}
	}
}

// signal sends sig to the child (SIGSTOP freezes it: its sockets stay open and its kernel
// still answers TCP keepalives; SIGCONT resumes it).
func (c *child) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := c.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

func (c *child) kill(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = c.cmd.Wait()
}

// A relay SIGKILLed after the broker acknowledged its records and before it marked the rows
// publishes nothing twice under different ids and loses nothing: the next relay publishes
// the rows again with the same kafkatx-outbox-id, key and value.
func TestKilledBetweenProduceAndMarkRepublishesWithSameIDs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testenv.Topic(t, b.brokers, 3)
	const rows = 500
	var recs []outbox.Record
	for i := 0; i < rows; i++ {
		recs = append(recs, outbox.Record{Topic: topic, Key: []byte(fmt.Sprintf("k%d", i%17)), Value: []byte(fmt.Sprintf("v%d", i))})
	}
	b.write(t, recs...)

	c := b.startChild(t, "hang-before-mark")
	var delivered int
	line := c.expect(t, "DELIVERED ", 60*time.Second)
	if _, err := fmt.Sscanf(line, "DELIVERED %d", &delivered); err != nil || delivered == 0 {
		t.Fatalf("child said %q", line)
	}
	c.kill(t)
	for id, st := range b.states(t) {
		if st != "pending" {
			t.Fatalf("row %d is %s after the kill; want every row still pending (killed before marking)", id, st)
		}
	}
	if n := topicCount(t, b.brokers, topic); n != int64(delivered) {
		t.Fatalf("topic holds %d records after the kill, child reported %d delivered", n, delivered)
	}

	r, _ := b.start(t, b.config(t))
	waitFor(t, 30*time.Second, "every row published by the second relay", func() bool { return r.Stats().Published == rows })
	msgs := readAll(t, b.brokers, topic)
	if len(msgs) != rows+delivered {
		t.Fatalf("topic holds %d records, want %d + %d copies", len(msgs), rows, delivered)
	}
	type rec struct{ key, value string }
	first := map[string]rec{}
	copies := map[string]int{}
	for _, m := range msgs {
		id, ok := header(m, outbox.HeaderOutboxID)
		if !ok {
			t.Fatalf("record without %s", outbox.HeaderOutboxID)
		}
		copies[id]++
		if f, seen := first[id]; seen && (f.key != string(m.Key) || f.value != string(m.Value)) {
			t.Fatalf("outbox id %s published as %v and as %q/%q", id, f, m.Key, m.Value)
		}
		first[id] = rec{string(m.Key), string(m.Value)}
	}
	twice := 0
	for row, id := range b.outboxIDs(t) {
		switch copies[id] {
		case 1:
		case 2:
			twice++
		default:
			t.Fatalf("row %d (outbox id %s) published %d times", row, id, copies[id])
		}
	}
	if twice != delivered {
		t.Fatalf("%d rows published twice, want the %d the killed relay delivered", twice, delivered)
	}
	t.Logf("killed relay had delivered %d of %d rows; after restart every row is on the topic, %d twice with the same id", delivered, rows, twice)
}

// Two relay processes: only the leader publishes; when it is SIGKILLed the standby takes
// over — at once, as PostgreSQL ends the dead leader's session and its lock: LeaderTimeout is
// ten minutes, so a takeover within the wait's ceiling cannot come from a timeout — and
// publishes the rest.
func TestStandbyTakesOverWhenTheLeaderIsKilled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testenv.Topic(t, b.brokers, 3)
	env := envChildLeader + "=10m"
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
	write(0, 200)
	waitCount(t, b.brokers, topic, 200, 60*time.Second)
	if sb.printed("LEADER", 500*time.Millisecond) {
		t.Fatal("the standby became leader while the first relay was alive")
	}
	var locks int
	err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND ((classid::bigint << 32) | objid::bigint) = hashtextextended('kafkatx.relay.' || $1, 0)`, b.schema).Scan(&locks)
	if err != nil || locks != 1 {
		t.Fatalf("leadership locks held: %d, %v; want exactly 1", locks, err)
	}

	killed := time.Now()
	a.kill(t)
	sb.expect(t, "LEADER", 60*time.Second)
	takeover := time.Since(killed)
	write(200, 200)
	waitCount(t, b.brokers, topic, 400, 60*time.Second)
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
	t.Logf("standby took over %s after SIGKILL of the leader (standby interval 200ms)", takeover.Round(time.Millisecond))
}
