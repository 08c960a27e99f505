package kafkatx

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
)

// Tests of the KIP-848 consumer group protocol (group.protocol=consumer), an opt-in: classic
// stays the default. librdkafka 2.11 (confluent-kafka-go v2.11.1) calls it a preview.

// TestGroupProtocolConsumerIsAnOptInWithAdaptedDefaults needs no broker: classic is the
// default (with kafkatx's cooperative-sticky assignor); with group.protocol=consumer kafkatx
// sets no client assignor, and each classic-only setting librdkafka refuses under the new
// protocol is refused by NewConsumer with an error naming it and the broker setting to use.
// librdkafka itself accepts the adapted configuration and refuses each of those settings, so
// the list matches the client's.
func TestGroupProtocolConsumerIsAnOptInWithAdaptedDefaults(t *testing.T) {
	base := func(extra kafka.ConfigMap) *Config {
		km := kafka.ConfigMap{"bootstrap.servers": "127.0.0.1:1", "group.id": "g"}
		for k, v := range extra {
			km[k] = v
		}
		return &Config{Kafka: km, Topics: []string{"t"}}
	}
	c, err := base(nil).settings()
	if err != nil {
		t.Fatal(err)
	}
	if c.Kafka["group.protocol"] != "classic" || c.Kafka["partition.assignment.strategy"] != "cooperative-sticky" {
		t.Fatalf("default group.protocol=%v partition.assignment.strategy=%v; want classic, cooperative-sticky",
			c.Kafka["group.protocol"], c.Kafka["partition.assignment.strategy"])
	}
	for _, proto := range []string{"consumer", "CONSUMER"} {
		c, err = base(kafka.ConfigMap{"group.protocol": proto, "group.remote.assignor": "uniform"}).settings()
		if err != nil {
			t.Fatalf("group.protocol=%s: %v", proto, err)
		}
		if c.Kafka["group.protocol"] != "consumer" {
			t.Fatalf("group.protocol=%s became %v", proto, c.Kafka["group.protocol"])
		}
		for _, k := range []string{"partition.assignment.strategy", "session.timeout.ms", "heartbeat.interval.ms"} {
			if _, ok := c.Kafka[k]; ok {
				t.Fatalf("group.protocol=consumer: kafkatx set %s=%v, which librdkafka refuses", k, c.Kafka[k])
			}
		}
	}
	adapted := c.Kafka
	adapted["go.logs.channel.enable"] = true // librdkafka's preview warning goes nowhere
	kc, err := kafka.NewConsumer(&adapted)
	if err != nil {
		t.Fatalf("librdkafka refuses kafkatx's configuration for group.protocol=consumer: %v", err)
	}
	kc.Close()

	for _, r := range consumerProtocolRefused {
		val := kafka.ConfigValue(6000)
		if r.key == "partition.assignment.strategy" {
			val = "cooperative-sticky"
		} else if r.key == "group.protocol.type" {
			val = "consumer"
		}
		_, err := base(kafka.ConfigMap{"group.protocol": "consumer", r.key: val}).settings()
		if err == nil || !strings.Contains(err.Error(), r.key) || !strings.Contains(err.Error(), "group.protocol=consumer") {
			t.Fatalf("group.protocol=consumer with %s: err %v; want a refusal naming it", r.key, err)
		}
		raw := kafka.ConfigMap{"bootstrap.servers": "127.0.0.1:1", "group.id": "g", "group.protocol": "consumer", r.key: val, "go.logs.channel.enable": true}
		if kc, err := kafka.NewConsumer(&raw); err == nil {
			kc.Close()
			t.Fatalf("librdkafka accepts %s under group.protocol=consumer: kafkatx need not refuse it", r.key)
		}
		// Classic keeps them.
		if _, err := base(kafka.ConfigMap{r.key: val}).settings(); err != nil {
			t.Fatalf("classic with %s: %v", r.key, err)
		}
	}
	if _, err := base(kafka.ConfigMap{"group.protocol": "streams"}).settings(); err == nil || !strings.Contains(err.Error(), "group.protocol") {
		t.Fatalf("group.protocol=streams: err %v; want a refusal", err)
	}
}

// consumerProtocolConfig is b.config for group.protocol=consumer: no client session timeout
// or heartbeat interval (the broker's group.consumer.* settings decide them).
func (b *testBundle) consumerProtocolConfig(t *testing.T) *Config {
	cfg := b.config(t)
	delete(cfg.Kafka, "session.timeout.ms")
	delete(cfg.Kafka, "heartbeat.interval.ms")
	cfg.Kafka["group.protocol"] = "consumer"
	return cfg
}

// groupType asks the broker which protocol the group runs.
func (b *testBundle) groupType(t *testing.T) kafka.ConsumerGroupType {
	t.Helper()
	a, err := kafka.NewAdminClient(&kafka.ConfigMap{"bootstrap.servers": b.brokers})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := a.DescribeConsumerGroups(ctx, []string{b.group})
	if err != nil || len(res.ConsumerGroupDescriptions) != 1 {
		t.Fatalf("describe group %s: %v %v", b.group, err, res)
	}
	return res.ConsumerGroupDescriptions[0].Type
}

// consumerSessionTimeout is the broker's group.consumer.session.timeout.ms.
func (b *testBundle) consumerSessionTimeout(t *testing.T) time.Duration {
	t.Helper()
	a, err := kafka.NewAdminClient(&kafka.ConfigMap{"bootstrap.servers": b.brokers})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	md, err := a.GetMetadata(nil, false, 10000)
	if err != nil || len(md.Brokers) == 0 {
		t.Fatalf("metadata: %v", err)
	}
	res, err := a.DescribeConfigs(ctx, []kafka.ConfigResource{{Type: kafka.ResourceBroker, Name: strconv.Itoa(int(md.Brokers[0].ID))}})
	if err != nil || len(res) != 1 {
		t.Fatalf("describe broker configs: %v", err)
	}
	e, ok := res[0].Config["group.consumer.session.timeout.ms"]
	if !ok {
		t.Fatal("the broker has no group.consumer.session.timeout.ms")
	}
	ms, err := strconv.Atoi(e.Value)
	if err != nil {
		t.Fatal(err)
	}
	return time.Duration(ms) * time.Millisecond
}

// logEnds returns each partition's log end offset.
func (b *testBundle) logEnds(t *testing.T, partitions int) map[int32]int64 {
	t.Helper()
	c, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": b.brokers, "group.id": b.group + "-ends", "go.logs.channel.enable": true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	out := map[int32]int64{}
	for p := int32(0); p < int32(partitions); p++ {
		_, high, err := c.QueryWatermarkOffsets(b.topic, p, 10000)
		if err != nil {
			t.Fatal(err)
		}
		out[p] = high
	}
	return out
}

// checkExactAtLogEnd asserts the end state of a drained topic: every record applied exactly
// once, no dead letter, and per partition watermark = Kafka's committed offset = log end.
func (b *testBundle) checkExactAtLogEnd(t *testing.T, partitions int, total int64) {
	t.Helper()
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.effects"); n != total {
		t.Fatalf("%d effects, want %d (one per record)", n, total)
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.effects WHERE applied <> 1"); n != 0 {
		t.Fatalf("%d records applied more than once", n)
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.dead_letters"); n != 0 {
		t.Fatalf("%d dead letters; want none", n)
	}
	ends := b.logEnds(t, partitions)
	committed := b.committedOffsets(t, partitions)
	var sum int64
	for p := int32(0); p < int32(partitions); p++ {
		w := b.q(t, "SELECT coalesce(max(next_offset), -1) FROM {{schema}}.watermarks WHERE partition = $1", p)
		if w != ends[p] || committed[p] != ends[p] {
			t.Fatalf("partition %d: watermark %d, committed %d, log end %d; want all equal", p, w, committed[p], ends[p])
		}
		sum += ends[p]
	}
	if sum != total {
		t.Fatalf("log ends sum to %d, want %d", sum, total)
	}
}

// Issue 16: group.protocol=consumer (KIP-848) was not supported: kafkatx set a client assignor
// that librdkafka refuses under it. Now, on the real broker, members join and leave a
// consumer-protocol group mid-stream — incremental, broker-driven reassignments while records
// keep arriving — and every record is applied exactly once, with each partition's watermark,
// Kafka's committed offset and its log end equal at the end.
func TestKIP848MembersJoiningAndLeavingMidStreamApplyEachRecordOnce(t *testing.T) {
	t.Parallel()
	const partitions, total = 6, 6000
	b := setup(t, partitions)
	slow := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		time.Sleep(2 * time.Millisecond)
		return applyEffect(ctx, tx, b.schema, m)
	}
	// Records arrive while members come and go: 20 rounds of 300, one every 300 ms.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < total/300; i++ {
			produce(t, b.brokers, b.topic, values(300, -1, func(j int) string { return fmt.Sprint(i*300 + j) }))
			time.Sleep(300 * time.Millisecond)
		}
	}()
	applied := func() int64 { return b.q(t, "SELECT count(*) FROM {{schema}}.effects") }
	member := func() *running {
		cfg := b.consumerProtocolConfig(t)
		cfg.Batch.Size = 20
		return b.start(t, slow, cfg)
	}
	mA := member()
	waitFor(t, 60*time.Second, "member A to apply 600 records", func() bool { return applied() >= 600 })
	if typ := b.groupType(t); typ != kafka.ConsumerGroupTypeConsumer {
		t.Fatalf("the group runs the %s protocol, want consumer (KIP-848)", typ)
	}
	mB := member()
	waitFor(t, 60*time.Second, "member B to get partitions", func() bool { return mB.c.Stats().Assigned > 0 })
	waitFor(t, 60*time.Second, "1,800 records applied", func() bool { return applied() >= 1800 })
	mC := member()
	waitFor(t, 60*time.Second, "member C to get partitions", func() bool { return mC.c.Stats().Assigned > 0 })
	waitFor(t, 60*time.Second, "3,000 records applied", func() bool { return applied() >= 3000 })
	t.Logf("before A leaves: assigned A=%d B=%d C=%d", mA.c.Stats().Assigned, mB.c.Stats().Assigned, mC.c.Stats().Assigned)
	if err := mA.stop(t); err != nil {
		t.Fatalf("member A: %v", err)
	}
	waitFor(t, 60*time.Second, "4,200 records applied", func() bool { return applied() >= 4200 })
	if err := mB.stop(t); err != nil {
		t.Fatalf("member B: %v", err)
	}
	wg.Wait()
	waitFor(t, 120*time.Second, "member C to apply every record", func() bool { return applied() >= total })
	if a := mC.c.Stats().Assigned; a != partitions {
		t.Fatalf("the last member holds %d partitions, want all %d", a, partitions)
	}
	stA, stB, stC := mA.c.Stats(), mB.c.Stats(), mC.c.Stats()
	if err := mC.stop(t); err != nil {
		t.Fatalf("member C: %v", err)
	}
	t.Logf("processed A=%d B=%d C=%d, duplicates skipped %d", stA.Processed, stB.Processed, stC.Processed, stA.Duplicates+stB.Duplicates+stC.Duplicates)
	for name, s := range map[string]Stats{"A": stA, "B": stB, "C": stC} {
		if s.Processed == 0 {
			t.Fatalf("member %s processed nothing: the members did not share the stream", name)
		}
	}
	b.checkExactAtLogEnd(t, partitions, total)
}

// kip848ChildEnv runs this test binary as a consumer-protocol member (kip848ChildMain).
const kip848ChildEnv = "KAFKATX_TEST_KIP848_CHILD"

// kip848ChildMain is a consumer-protocol member in a child process: it applies effects
// (slowly), writes its Stats as JSON to CHILD_STATS every 100 ms, and runs until SIGTERM.
func kip848ChildMain() int {
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
	c, err := NewConsumer(pool, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		time.Sleep(2 * time.Millisecond)
		return applyEffect(ctx, tx, schema, m)
	}, &Config{
		Kafka:  kafka.ConfigMap{"bootstrap.servers": env("CHILD_BROKERS"), "group.id": env("CHILD_GROUP"), "group.protocol": "consumer"},
		Topics: []string{env("CHILD_TOPIC")}, Schema: schema, Logger: log, Batch: BatchConfig{Size: 20},
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
			b, _ := json.Marshal(c.Stats())
			_ = os.WriteFile(env("CHILD_STATS")+".tmp", b, 0o644)
			_ = os.Rename(env("CHILD_STATS")+".tmp", env("CHILD_STATS"))
		}
	}()
	if err := c.Run(runCtx); err != nil {
		log.Error("run", zap.Error(err))
		return 1
	}
	return 0
}

// kip848Child is a consumer-protocol member running in a child process (kip848ChildMain).
type kip848Child struct {
	cmd    *exec.Cmd
	stats  string // its Stats, JSON, rewritten every 100 ms
	log    string // its stdout and stderr
	exited chan error
}

func (b *testBundle) startKIP848Child(t *testing.T, name string) *kip848Child {
	t.Helper()
	dir := t.TempDir()
	c := &kip848Child{stats: filepath.Join(dir, "stats.json"), log: filepath.Join(dir, "child.log"), exited: make(chan error, 1)}
	c.cmd = exec.Command(os.Args[0], "-test.run=^$")
	c.cmd.Env = append(os.Environ(), kip848ChildEnv+"=1", "CHILD_DB="+b.dbURL, "CHILD_SCHEMA="+b.schema, "CHILD_BROKERS="+b.brokers,
		"CHILD_TOPIC="+b.topic, "CHILD_GROUP="+b.group, "CHILD_STATS="+c.stats)
	f, err := os.Create(c.log)
	if err != nil {
		t.Fatal(err)
	}
	c.cmd.Stdout, c.cmd.Stderr = f, f
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.exited <- c.cmd.Wait(); f.Close() }()
	t.Cleanup(func() {
		_ = c.cmd.Process.Signal(syscall.SIGCONT)
		_ = c.cmd.Process.Kill()
		if t.Failed() {
			t.Logf("%s output:\n%s", name, tail(c.output(), 8000))
		}
	})
	return c
}

func (c *kip848Child) output() string { out, _ := os.ReadFile(c.log); return string(out) }

func (c *kip848Child) Stats() Stats {
	var s Stats
	out, _ := os.ReadFile(c.stats)
	_ = json.Unmarshal(out, &s)
	return s
}

// Issue 16: a member of a consumer-protocol group frozen (SIGSTOP) past the broker's
// group.consumer.session.timeout.ms is fenced: the group gives its partitions to the other
// member. When it wakes, its heartbeats and commits are refused (fenced or stale member epoch,
// unknown member): that must not be fatal nor re-run a database transaction. It rejoins, gets
// partitions again and goes on. Then it is SIGKILLed mid-stream: its partitions move after the
// session timeout and a new process joins. Every record is applied exactly once and, at the
// end, each partition's watermark, committed offset and log end are equal.
func TestKIP848FencedMemberRejoinsWithoutDuplicates(t *testing.T) {
	t.Parallel()
	const partitions = 4
	b := setup(t, partitions)
	session := b.consumerSessionTimeout(t)
	produce(t, b.brokers, b.topic, values(2000, -1, func(i int) string { return fmt.Sprint(i) }))
	var total int64 = 2000
	applied := func() int64 { return b.q(t, "SELECT count(*) FROM {{schema}}.effects") }

	child := b.startKIP848Child(t, "first child")
	waitFor(t, 60*time.Second, "the child member to apply 300 records", func() bool { return applied() >= 300 })

	cfg := b.consumerProtocolConfig(t)
	cfg.Batch.Size = 20
	other := b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		time.Sleep(2 * time.Millisecond)
		return applyEffect(ctx, tx, b.schema, m)
	}, cfg)
	waitFor(t, 60*time.Second, "the two members to share the partitions", func() bool {
		return other.c.Stats().Assigned > 0 && child.Stats().Assigned > 0
	})
	if err := child.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozenAt := time.Now()
	before := child.Stats()
	waitFor(t, session+30*time.Second, "the group to fence the frozen member and give its partitions to the other", func() bool {
		return other.c.Stats().Assigned == partitions
	})
	t.Logf("frozen member fenced: the other holds all %d partitions %s after the freeze (session timeout %s)", partitions, time.Since(frozenAt).Round(100*time.Millisecond), session)
	produce(t, b.brokers, b.topic, values(1000, -1, func(i int) string { return fmt.Sprint(2000 + i) }))
	total += 1000
	if err := child.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	woke := time.Now()
	waitFor(t, 60*time.Second, "the woken member to rejoin and get partitions back", func() bool {
		return child.Stats().Assigned > 0 && other.c.Stats().Assigned < partitions
	})
	t.Logf("fenced member rejoined %s after waking", time.Since(woke).Round(100*time.Millisecond))
	produce(t, b.brokers, b.topic, values(1000, -1, func(i int) string { return fmt.Sprint(3000 + i) }))
	total += 1000
	waitFor(t, 120*time.Second, "every record applied", func() bool { return applied() >= total })
	select {
	case err := <-child.exited:
		t.Fatalf("the fenced member exited (%v): being fenced must not be fatal", err)
	default:
	}
	if after := child.Stats(); after.Processed <= before.Processed {
		t.Fatalf("the fenced member processed nothing after it rejoined (%d before the freeze, %d at the end)", before.Processed, after.Processed)
	}
	log := child.output()
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "lost") || strings.Contains(l, "refused") || strings.Contains(l, "FENCED") || strings.Contains(l, "STALE") || strings.Contains(l, "UNKNOWN_MEMBER") {
			t.Logf("fenced member: %s", tail(l, 400))
		}
	}
	if !strings.Contains(log, "partitions lost") {
		t.Fatal("the frozen member's log does not say it lost its partitions: was it fenced at all?")
	}
	if strings.Contains(log, "fatal Kafka error") {
		t.Fatal("the fenced member logged a fatal Kafka error")
	}

	// SIGKILL mid-stream: records keep arriving, the killed member's partitions move to the
	// other after the session timeout, and a new process joins.
	produce(t, b.brokers, b.topic, values(2000, -1, func(i int) string { return fmt.Sprint(4000 + i) }))
	total += 2000
	waitFor(t, 60*time.Second, "the member to be working on the new records", func() bool { return child.Stats().Processed > before.Processed+200 })
	if err := child.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-child.exited
	killedAt := time.Now()
	waitFor(t, session+30*time.Second, "the killed member's partitions to move to the other", func() bool {
		return other.c.Stats().Assigned == partitions
	})
	t.Logf("SIGKILLed member's partitions moved %s after the kill", time.Since(killedAt).Round(100*time.Millisecond))
	second := b.startKIP848Child(t, "second child")
	waitFor(t, 60*time.Second, "a new process to join and get partitions", func() bool { return second.Stats().Assigned > 0 })
	waitFor(t, 120*time.Second, "every record applied after the kill", func() bool { return applied() >= total })
	if err := other.stop(t); err != nil {
		t.Fatalf("the other member: %v", err)
	}
	_ = second.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-second.exited:
		if err != nil {
			t.Fatalf("the second child exited with %v after SIGTERM; want 0", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the second child did not stop within 60 s of SIGTERM")
	}
	b.checkExactAtLogEnd(t, partitions, total)
}

// Under group.protocol=consumer a member the broker gives no partition (more members than
// partitions) is ready too: it joined the group, its assignment is empty.
func TestKIP848MemberWithAnEmptyAssignmentIsReady(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error { return nil }
	r1 := b.start(t, h, b.consumerProtocolConfig(t))
	waitFor(t, 60*time.Second, "the first member ready", func() bool { return r1.c.Ready(context.Background()) == nil })
	r2 := b.start(t, h, b.consumerProtocolConfig(t))
	waitFor(t, 60*time.Second, "both members ready, one of them with no partition", func() bool {
		return r1.c.Ready(context.Background()) == nil && r2.c.Ready(context.Background()) == nil &&
			r1.c.Stats().Assigned+r2.c.Stats().Assigned == 1
	})
}
