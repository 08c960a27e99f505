package kafkatx

import (
	"github.com/kafkatx/kafkatx/internal/engine"

	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// The liveness tests run consumers in child processes (this test binary re-executed with
// liveChildEnv set to a mode) to freeze them with SIGSTOP, to start two with one
// group.instance.id, and to read what a process prints on stderr.

const liveChildEnv = "KAFKATX_TEST_LIVE_CHILD"

// liveChild returns the child's command and a function that reads what it has written to its
// stdout and stderr so far (a file: safe to read while the child runs).
func liveChild(t *testing.T, mode string, env ...string) (*exec.Cmd, func() string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), liveChildEnv+"="+mode), env...)
	f, err := os.CreateTemp(t.TempDir(), mode+"-*.log")
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	out := func() string {
		b, _ := os.ReadFile(f.Name())
		return string(b)
	}
	t.Cleanup(func() {
		if cmd.Process != nil { // the test waits for it; a child that already ended ignores these
			_ = cmd.Process.Signal(syscall.SIGCONT)
			_ = cmd.Process.Kill()
		}
		f.Close()
		if t.Failed() {
			t.Logf("%s child output:\n%s", mode, tail(out(), 6000))
		}
	})
	return cmd, out
}

func liveChildMain(mode string) int {
	env := os.Getenv
	log := zap.Must(zap.NewProductionConfig().Build()) // JSON on stderr
	ctx, stop := signalContext()
	defer stop()
	pool, err := pgxpool.New(ctx, env("CHILD_DB"))
	if err != nil {
		log.Error("pool", zap.Error(err))
		return 2
	}
	defer pool.Close()
	schema := env("CHILD_SCHEMA")
	kcfg := kafka.ConfigMap{"bootstrap.servers": env("CHILD_BROKERS"), "group.id": env("CHILD_GROUP"), "session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
	var h Handler
	switch mode {
	case "freeze":
		// Freezes itself (SIGSTOP) inside the transaction that applied "freeze-me", holding its
		// row locks, once (marker file).
		mark := env("CHILD_MARK")
		h = func(ctx context.Context, tx pgx.Tx, m *Message) error {
			if err := applyHot(ctx, tx, schema, m); err != nil {
				return err
			}
			if string(m.Value) == "freeze-me" {
				if _, err := os.Stat(mark); err != nil {
					_ = os.WriteFile(mark, nil, 0o644)
					_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
				}
			}
			return nil
		}
	case "static":
		kcfg["group.instance.id"] = env("CHILD_INSTANCE")
		h = func(ctx context.Context, tx pgx.Tx, m *Message) error { return applyEffect(ctx, tx, schema, m) }
	case "nobroker":
		h = func(ctx context.Context, tx pgx.Tx, m *Message) error { return nil }
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 6*time.Second)
		defer cancel()
	}
	c, err := NewConsumer(pool, h, &Config{Kafka: kcfg, Topics: []string{env("CHILD_TOPIC")}, Schema: schema, Logger: log,
		Retry: RetryPolicy{InitialBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond}})
	if err != nil {
		log.Error("consumer", zap.Error(err))
		return 2
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		for runCtx.Err() == nil {
			time.Sleep(100 * time.Millisecond)
			s := c.Stats()
			if mark := env("CHILD_ASSIGNED_MARK"); mark != "" && !s.FirstAssignedAt.IsZero() {
				_ = os.WriteFile(mark, nil, 0o644)
			}
			if mode == "nobroker" && time.Until(deadlineOf(ctx)) < time.Second {
				b, _ := json.Marshal(c.Readiness(runCtx))
				_ = os.WriteFile(env("CHILD_READINESS"), b, 0o644)
			}
			last := s.LastMessageAt
			if s.FirstAssignedAt.After(last) {
				last = s.FirstAssignedAt
			}
			if mode == "freeze" && !s.FirstAssignedAt.IsZero() && s.InFlight == 0 && time.Since(last) > 3*time.Second {
				cancel()
			}
		}
	}()
	if err := c.Run(runCtx); err != nil {
		log.Error("run", zap.Error(err))
		return 1
	}
	return 0
}

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGTERM)
}

func deadlineOf(ctx context.Context) time.Time {
	d, ok := ctx.Deadline()
	if !ok {
		return time.Now().Add(time.Hour)
	}
	return d
}

// applyHot applies m's effect and counts it on one hot row, so every consumer transaction
// takes the same row lock.
func applyHot(ctx context.Context, tx pgx.Tx, schema string, m *Message) error {
	if err := applyEffect(ctx, tx, schema, m); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, fmt.Sprintf(`UPDATE %s SET n = n + 1`, pgx.Identifier{schema, "hot"}.Sanitize()))
	return err
}

func (b *testBundle) childEnv() []string {
	return []string{"CHILD_DB=" + b.dbURL, "CHILD_SCHEMA=" + b.schema, "CHILD_BROKERS=" + b.brokers, "CHILD_TOPIC=" + b.topic, "CHILD_GROUP=" + b.group}
}

// Issue "liveness" 1: a consumer frozen inside its transaction (SIGSTOP, past its session
// timeout) held its row locks for as long as it was frozen and the group's new owner waited on
// them. Now the server ends the frozen session after Config.Transaction.IdleTimeout (default
// 10 s), the other consumer goes on while it is still frozen, and the frozen one's late commit
// is fenced: every effect exact after SIGCONT.
func TestFrozenConsumerInsideItsTransactionDoesNotStallTheGroup(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	b.exec(t, `CREATE TABLE {{schema}}.hot (n bigint NOT NULL); INSERT INTO {{schema}}.hot VALUES (0)`)
	const perPartition = 200
	for p := int32(0); p < 2; p++ {
		produce(t, b.brokers, b.topic, values(perPartition, p, func(i int) string {
			if p == 0 && i == 50 {
				return "freeze-me"
			}
			return fmt.Sprint(i)
		}))
	}
	mark := filepath.Join(t.TempDir(), "frozen")
	a, _ := liveChild(t, "freeze", append(b.childEnv(), "CHILD_MARK="+mark)...)
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "the child to freeze itself", func() bool { return processStopped(a.Process.Pid) })
	frozenAt := time.Now()
	var locks int64
	// The frozen process's session sits idle in transaction holding a lock on the hot row's table.
	deadline := time.Now().Add(10 * time.Second)
	for locks == 0 && time.Now().Before(deadline) {
		locks = b.q(t, `SELECT count(*) FROM pg_stat_activity a WHERE a.state LIKE 'idle in transaction%'
			AND EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid AND l.relation = $1::regclass AND l.mode = 'RowExclusiveLock')`,
			pgx.Identifier{b.schema, "hot"}.Sanitize())
		time.Sleep(50 * time.Millisecond)
	}
	if locks == 0 {
		rows, _ := b.pool.Query(context.Background(), `SELECT pid, state, left(query, 120) FROM pg_stat_activity WHERE datname = current_database()`)
		for rows.Next() {
			var pid int
			var state, query *string
			_ = rows.Scan(&pid, &state, &query)
			t.Logf("session %d %v %v", pid, deref(state), deref(query))
		}
		rows.Close()
		t.Fatal("the frozen child holds no lock on the hot row idle in transaction")
	}

	cfg := b.config(t)
	r := b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error { return applyHot(ctx, tx, b.schema, m) }, cfg)
	// The frozen process's session timeout (6 s) hands its partitions over; its locks go
	// with its session after the 10 s idle bound. The freeze lasts until the SIGCONT below;
	// processStopped checks that it still held, so the ceiling only catches a hang.
	waitFor(t, 120*time.Second, "the other consumer to apply every message while one is frozen", func() bool {
		return b.q(t, "SELECT n FROM {{schema}}.hot") == 2*perPartition
	})
	if !processStopped(a.Process.Pid) {
		t.Fatal("the child woke up before the other consumer finished: the test proves nothing")
	}
	t.Logf("applied all %d while one consumer was frozen in its transaction; %s after the freeze", 2*perPartition, time.Since(frozenAt).Round(100*time.Millisecond))
	_ = a.Process.Signal(syscall.SIGCONT)
	done := make(chan error, 1)
	go func() { done <- a.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the woken child: %v", err)
		}
	case <-time.After(90 * time.Second):
		t.Fatal("the woken child did not exit")
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if n := b.q(t, "SELECT n FROM {{schema}}.hot"); n != 2*perPartition {
		t.Fatalf("hot counter %d after the frozen consumer woke, want %d (its late commit must stay fenced)", n, 2*perPartition)
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.effects WHERE applied = 1"); n != 2*perPartition {
		t.Fatalf("%d effects applied once, want %d", n, 2*perPartition)
	}
	if n := b.q(t, "SELECT sum(next_offset) FROM {{schema}}.watermarks"); n != 2*perPartition {
		t.Fatalf("watermarks sum to %d", n)
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.dead_letters"); n != 0 {
		t.Fatalf("%d dead letters: a session ended for idling or a lock timeout counted as attempts", n)
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// processStopped reports whether pid is in state T (stopped by a signal).
func processStopped(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] == 'T'
}

// Issue "liveness" 4: a static member fenced by a second process with its group.instance.id
// hung in Consumer.Close and ignored SIGTERM. Now Run returns the fatal error and the process
// exits non-zero within a bounded time. Issue "outages" 1: a fence alone no longer ends Run
// (a broker that forgot the member fences it too): the fenced member rejoins with a new Kafka
// client, and only a fence that repeats within engine.FenceRepeatWindow of that rejoin, the
// brokers reachable, ends it — with the error saying another live process holds the id. One
// of the two exits so; the other goes on.
func TestFencedStaticMemberEndsRun(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	produce(t, b.brokers, b.topic, values(20, -1, func(i int) string { return fmt.Sprint(i) }))
	instance := "same-" + b.topic
	dir := t.TempDir()
	env := append(b.childEnv(), "CHILD_INSTANCE="+instance)
	first, out1 := liveChild(t, "static", append(env, "CHILD_ASSIGNED_MARK="+filepath.Join(dir, "a1"))...)
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "the first member's assignment", func() bool { _, err := os.Stat(filepath.Join(dir, "a1")); return err == nil })
	second, out2 := liveChild(t, "static", env...)
	if err := second.Start(); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	exited := make(chan string, 2)
	for name, cmd := range map[string]*exec.Cmd{"first": first, "second": second} {
		go func() {
			err := cmd.Wait()
			exited <- fmt.Sprintf("%s:%v", name, err)
		}()
	}
	select {
	case e := <-exited:
		if strings.HasSuffix(e, ":<nil>") {
			t.Fatalf("%s exited 0 after being fenced; want non-zero", e)
		}
		out := out1()
		if strings.HasPrefix(e, "second") {
			out = out2()
		}
		if !strings.Contains(out, "another live process holds this member's group.instance.id") {
			t.Fatalf("%s exited without saying another live process holds the id", e)
		}
		t.Logf("%s, %s after the second member started", e, time.Since(started).Round(100*time.Millisecond))
		select {
		case e2 := <-exited:
			t.Fatalf("both members exited (%s, then %s); want the one holding the id to go on", e, e2)
		case <-time.After(15 * time.Second):
		}
	case <-time.After(3 * time.Minute):
		t.Fatal("two processes with one group.instance.id: neither exited within 3 minutes")
	}
}

// Issue "liveness" 2: a subscribed topic that does not exist was silent (logs said
// "consumer started", then nothing). Now it is logged at error level by name within seconds
// and Readiness lists it.
func TestMissingTopicIsLoggedByNameAndNotReady(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	core, logs := observer.New(zapcore.InfoLevel)
	cfg := b.config(t)
	cfg.Logger = zap.New(core)
	missing := b.topic + "-missing"
	cfg.Topics = []string{b.topic, missing}
	r := b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error { return nil }, cfg)
	waitFor(t, 60*time.Second, "an error line naming the missing topic", func() bool {
		for _, e := range logs.FilterLevelExact(zapcore.ErrorLevel).All() {
			if e.ContextMap()["topic"] == missing {
				return true
			}
		}
		return false
	})
	waitFor(t, 30*time.Second, "readiness to name the missing topic", func() bool {
		rd := r.c.Readiness(context.Background())
		return !rd.Ready && len(rd.MissingTopics) == 1 && rd.MissingTopics[0] == missing && rd.Joined
	})
	err := r.c.Ready(context.Background())
	var nr *NotReadyError
	if !errors.As(err, &nr) || !strings.Contains(err.Error(), missing) {
		t.Fatalf("Ready: %v", err)
	}
}

// Issue "liveness" 7: an ordinary assignment was not logged at info level. Now assignments
// and revocations are, with partitions and starting offsets; and a running consumer is ready.
func TestAssignmentsAreLoggedAtInfoAndTheConsumerIsReady(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	produce(t, b.brokers, b.topic, values(10, 1, func(i int) string { return fmt.Sprint(i) }))
	core, logs := observer.New(zapcore.InfoLevel)
	cfg := b.config(t)
	cfg.Logger = zap.New(core)
	r := b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error { return applyEffect(ctx, tx, b.schema, m) }, cfg)
	waitFor(t, 60*time.Second, "10 effects", func() bool { return b.q(t, "SELECT count(*) FROM {{schema}}.effects") == 10 })
	waitFor(t, 60*time.Second, "ready", func() bool { return r.c.Ready(context.Background()) == nil })
	var assigned []string
	for _, e := range logs.FilterMessage("partitions assigned").All() {
		for _, f := range e.Context {
			if f.Key == "partitions" {
				assigned = append(assigned, fmt.Sprint(f.Interface))
			}
		}
	}
	want := []string{fmt.Sprintf("%s[0]@0", b.topic), fmt.Sprintf("%s[1]@0", b.topic)}
	for _, w := range want {
		if !strings.Contains(strings.Join(assigned, " "), w) {
			t.Fatalf("assignment logs %q do not name %s", assigned, w)
		}
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	revoked := logs.FilterMessage("partitions revoked").All()
	if len(revoked) == 0 || !strings.Contains(fmt.Sprint(revoked[0].ContextMap()["partitions"]), fmt.Sprintf("%s[1]@10", b.topic)) {
		t.Fatalf("revocation log %v does not name %s[1]@10", revoked, b.topic)
	}
	if rd := r.c.Readiness(context.Background()); rd.Ready {
		t.Fatal("a stopped consumer reports ready")
	}
}

// Issue "liveness" 3: with a wrong broker address librdkafka printed its own plain-text lines
// (%3|...|FAIL|...) among the JSON logs and nothing said the consumer was not connected. Now
// they go through zap with their facility, and Readiness says Kafka is unreachable.
func TestWrongBrokerAddressIsLoggedThroughZapAndNotReady(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	readiness := filepath.Join(t.TempDir(), "readiness.json")
	env := b.childEnv()
	env = append(env, "CHILD_BROKERS=127.0.0.1:"+strconv.Itoa(port), "CHILD_READINESS="+readiness)
	cmd, out := liveChild(t, "nobroker", env...)
	if err := cmd.Run(); err != nil {
		t.Fatalf("child: %v", err)
	}
	facilities := 0
	sc := bufio.NewScanner(strings.NewReader(out()))
	for sc.Scan() {
		line := sc.Text()
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("a line on stderr that is not a JSON log line: %q", line)
		}
		if m["facility"] != nil && m["logger"] == "kafkatx.consumer.librdkafka" {
			facilities++
		}
	}
	if facilities == 0 {
		t.Fatal("no librdkafka log line went through zap (field facility)")
	}
	raw, err := os.ReadFile(readiness)
	if err != nil {
		t.Fatal(err)
	}
	var rd Readiness
	if err := json.Unmarshal(raw, &rd); err != nil {
		t.Fatal(err)
	}
	if rd.Ready || rd.KafkaError == "" || rd.Joined {
		t.Fatalf("readiness with no broker reachable: %s", raw)
	}
}

// Every consumer transaction carries its bounds (Config.Transaction), the idle bound at most
// 10 s by default.
func TestConsumerTransactionsAreBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, values(1, 0, func(i int) string { return "x" }))
	got := make(chan [3]string, 1)
	cfg := b.config(t)
	cfg.Transaction.LockTimeout = 1500 * time.Millisecond
	b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		var s [3]string
		for i, n := range []string{"idle_in_transaction_session_timeout", "lock_timeout", "statement_timeout"} {
			if err := tx.QueryRow(ctx, "SELECT current_setting($1)", n).Scan(&s[i]); err != nil {
				return err
			}
		}
		select {
		case got <- s:
		default:
		}
		return nil
	}, cfg)
	select {
	case s := <-got:
		if s != [3]string{"10s", "1500ms", "1min"} {
			t.Fatalf("idle_in_transaction_session_timeout, lock_timeout, statement_timeout = %q, want 10s, 1500ms, 1min", s)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("handler did not run")
	}
}

// A lock wait past lock_timeout (55P03) and a session ended for idling (25P03) are retried,
// not attempts: a message whose row is locked by someone else for longer than the lock
// timeout is applied once the lock goes, with no attempt counted.
func TestLockTimeoutIsRetriedNotAnAttempt(t *testing.T) {
	t.Parallel()
	for _, code := range []string{"55P03", "25P03", "57P05"} {
		if !engine.RetryableDB(&pgconn.PgError{Code: code}) {
			t.Fatalf("SQLSTATE %s not retryable", code)
		}
	}
	if engine.RetryableDB(&pgconn.PgError{Code: "57014"}) {
		t.Fatal("a statement timeout (57014) is the handler's failure, not retryable")
	}
	b := setup(t, 1)
	b.exec(t, `CREATE TABLE {{schema}}.hot (n bigint NOT NULL); INSERT INTO {{schema}}.hot VALUES (0)`)
	ctx := context.Background()
	holder, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx) //nolint:errcheck
	if _, err := holder.Exec(ctx, b.sql(`UPDATE {{schema}}.hot SET n = n`)); err != nil {
		t.Fatal(err)
	}
	produce(t, b.brokers, b.topic, values(3, 0, func(i int) string { return fmt.Sprint(i) }))
	cfg := b.config(t)
	cfg.Transaction.LockTimeout = 200 * time.Millisecond
	cfg.Retry.MaxAttempts = 2
	r := b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error { return applyHot(ctx, tx, b.schema, m) }, cfg)
	time.Sleep(3 * time.Second) // many lock timeouts, each far more than MaxAttempts
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "3 applied", func() bool { return b.q(t, "SELECT n FROM {{schema}}.hot") == 3 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.dead_letters"); n != 0 {
		t.Fatalf("%d dead letters: lock timeouts counted as attempts", n)
	}
	if s := r.c.Stats(); s.Retries != 0 || s.Processed != 3 {
		t.Fatalf("stats %+v: want 3 processed, no handler retries", s)
	}
}

// sql replaces {{schema}} as exec and q do.
func (b *testBundle) sql(s string) string {
	return strings.ReplaceAll(s, "{{schema}}", pgx.Identifier{b.schema}.Sanitize())
}

// A member whose assignment is empty (more members than partitions) is ready: it joined its
// group and received an assignment, possibly empty.
func TestMemberWithAnEmptyAssignmentIsReady(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error { return nil }
	r1 := b.start(t, h, b.config(t))
	waitFor(t, 60*time.Second, "the first member ready", func() bool { return r1.c.Ready(context.Background()) == nil })
	r2 := b.start(t, h, b.config(t))
	waitFor(t, 60*time.Second, "both members ready, one of them with no partition", func() bool {
		return r1.c.Ready(context.Background()) == nil && r2.c.Ready(context.Background()) == nil &&
			r1.c.Stats().Assigned+r2.c.Stats().Assigned == 1
	})
}
