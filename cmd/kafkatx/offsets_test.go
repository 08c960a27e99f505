package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/idempotency"
	"github.com/kafkatx/kafkatx/internal/offsets"
	"github.com/kafkatx/kafkatx/internal/offsetstate"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

// offsetsBundle is one offsets test's world: a fresh schema with an effects table, a fresh
// one-partition topic and group on the real broker, and the kafkatx binary built from this
// package.
type offsetsBundle struct {
	t       *testing.T
	pool    *pgxpool.Pool
	dbURL   string
	schema  string
	brokers string
	topic   string
	group   string
	cli     string
	// groupProtocol is the service's group.protocol (classic when empty).
	groupProtocol string
}

func offsetsSetup(t *testing.T) *offsetsBundle {
	t.Helper()
	pool := testenv.Postgres(t)
	b := &offsetsBundle{t: t, pool: pool, dbURL: testenv.DatabaseURL(t), schema: testenv.Schema(t, pool), brokers: testenv.Brokers(t)}
	b.topic = testenv.Topic(t, b.brokers, 1)
	b.group = testenv.Group(t)
	ctx := context.Background()
	if err := kafkatx.Migrate(ctx, pool, b.schema); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s ("offset" bigint PRIMARY KEY, applied int NOT NULL)`, b.table("effects"))); err != nil {
		t.Fatal(err)
	}
	b.cli = buildCLI(t)
	return b
}

func (b *offsetsBundle) table(name string) string { return pgx.Identifier{b.schema, name}.Sanitize() }

// q runs a query returning one integer; {{schema}} is replaced with the quoted schema.
func (b *offsetsBundle) q(sql string, args ...any) int64 {
	b.t.Helper()
	var n int64
	sql = strings.ReplaceAll(sql, "{{schema}}", pgx.Identifier{b.schema}.Sanitize())
	if err := b.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		b.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// produce writes values to partition 0 and returns once each is acknowledged.
func (b *offsetsBundle) produce(values ...string) { b.produceKeyed(false, values...) }

// produceKeyed writes values to partition 0, each with the business idempotency key
// "key-<value>" in the idempotency-key header when keyed.
func (b *offsetsBundle) produceKeyed(keyed bool, values ...string) {
	b.t.Helper()
	p, err := kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": b.brokers, "enable.idempotence": true, "acks": "all"})
	if err != nil {
		b.t.Fatal(err)
	}
	defer p.Close()
	ch := make(chan kafka.Event, len(values))
	for _, v := range values {
		m := &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &b.topic, Partition: 0}, Value: []byte(v)}
		if keyed {
			m.Headers = []kafka.Header{{Key: "idempotency-key", Value: []byte("key-" + v)}}
		}
		if err := p.Produce(m, ch); err != nil {
			b.t.Fatal(err)
		}
	}
	for range values {
		if m := (<-ch).(*kafka.Message); m.TopicPartition.Error != nil {
			b.t.Fatal(m.TopicPartition.Error)
		}
	}
}

// handler records one effect row per message, counting applications, panics on the value
// "poison" (a message that crashes the handler every time) and dead-letters "bad" at once.
func (b *offsetsBundle) handler() kafkatx.Handler {
	return func(ctx context.Context, tx pgx.Tx, m *kafkatx.Message) error {
		switch string(m.Value) {
		case "poison":
			panic("poison pill: cannot decode")
		case "bad":
			return kafkatx.Permanent(errors.New("bad order"))
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+b.table("effects")+` ("offset", applied) VALUES ($1, 1)
			ON CONFLICT ("offset") DO UPDATE SET applied = effects.applied + 1`, m.Offset)
		return err
	}
}

type offsetsService struct {
	cancel context.CancelFunc
	done   chan error
}

// start runs the service (the root package's consumer) in-process.
func (b *offsetsBundle) start() *offsetsService {
	b.t.Helper()
	km := kafka.ConfigMap{"bootstrap.servers": b.brokers, "group.id": b.group, "session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
	if b.groupProtocol == "consumer" { // KIP-848: the broker owns the session timing
		km = kafka.ConfigMap{"bootstrap.servers": b.brokers, "group.id": b.group, "group.protocol": "consumer"}
	}
	c, err := kafkatx.NewConsumer(b.pool, b.handler(), &kafkatx.Config{
		Kafka:  km,
		Topics: []string{b.topic},
		Schema: b.schema,
		Logger: zaptest.NewLogger(b.t, zaptest.Level(zap.ErrorLevel)),
		Retry:  kafkatx.RetryPolicy{MaxAttempts: 1000, InitialBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond},
		// Business idempotency keys from a header; a replay must not be swallowed by them.
		Idempotency: kafkatx.IdempotencyConfig{Key: idempotency.FromHeader("idempotency-key")},
	})
	if err != nil {
		b.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &offsetsService{cancel: cancel, done: make(chan error, 1)}
	go func() { s.done <- c.Run(ctx) }()
	b.t.Cleanup(func() { b.stop(s) })
	return s
}

// stop shuts the service down (it commits its watermarks and leaves the group).
func (b *offsetsBundle) stop(s *offsetsService) {
	b.t.Helper()
	if s.done == nil {
		return
	}
	s.cancel()
	select {
	case err := <-s.done:
		s.done = nil
		if err != nil {
			b.t.Fatalf("service stopped with %v", err)
		}
	case <-time.After(60 * time.Second):
		b.t.Fatal("service did not stop within 60s")
	}
}

func (b *offsetsBundle) waitFor(what string, cond func() bool) {
	b.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			b.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (b *offsetsBundle) watermark() int64 {
	return b.q("SELECT coalesce(max(next_offset), -1) FROM {{schema}}.watermarks WHERE group_id = $1", b.group)
}

// runUntil starts the service, waits for the watermark to reach want and stops it.
func (b *offsetsBundle) runUntil(want int64) {
	b.t.Helper()
	s := b.start()
	b.waitFor(fmt.Sprintf("watermark %d", want), func() bool { return b.watermark() == want })
	b.stop(s)
}

// runUntilStuck starts the service, waits until the message at offset has crashed the
// handler at least twice (the partition is blocked on it) and stops the service.
func (b *offsetsBundle) runUntilStuck(offset int64) {
	b.t.Helper()
	s := b.start()
	b.waitFor(fmt.Sprintf("offset %d to crash the handler twice", offset), func() bool {
		return b.q(`SELECT coalesce(max(attempts), 0) FROM {{schema}}.attempts WHERE group_id = $1 AND "offset" = $2`, b.group, offset) >= 2
	})
	b.stop(s)
}

// kafkatx runs the built command with the test's database, schema and brokers and returns
// its stdout and exit status.
func (b *offsetsBundle) kafkatx(args ...string) (string, int) {
	b.t.Helper()
	args = append(args, "--database-url", b.dbURL, "--brokers", b.brokers, "--schema", b.schema)
	cmd := exec.Command(b.cli, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("kafkatx %s → exit %d\n%s%s", strings.Join(args[:len(args)-6], " "), code, out.String(), errOut.String())
	return out.String(), code
}

// status runs `offsets status --output json` and returns partition 0's line and the exit status.
func (b *offsetsBundle) status() (offsets.PartitionStatus, int) {
	b.t.Helper()
	out, code := b.kafkatx("offsets", "status", "--group", b.group, "--topic", b.topic, "--output", "json")
	var s offsets.PartitionStatus
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &s); err != nil {
		b.t.Fatalf("status output %q: %v", out, err)
	}
	return s, code
}

func (b *offsetsBundle) audit() []offsetstore.Event {
	b.t.Helper()
	out, code := b.kafkatx("offsets", "audit", "--group", b.group, "--output", "json")
	if code != 0 {
		b.t.Fatalf("offsets audit exited %d", code)
	}
	var evs []offsetstore.Event
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var e offsetstore.Event
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			b.t.Fatalf("audit line %q: %v", line, err)
		}
		evs = append(evs, e)
	}
	return evs
}

func countKind(evs []offsetstore.Event, kind string, from, to int64) int {
	n := 0
	for _, e := range evs {
		if e.Kind == kind && e.From == from && e.To == to && e.Status == offsets.StatusApplied {
			n++
		}
	}
	return n
}

func (b *offsetsBundle) committed() int64 {
	b.t.Helper()
	k, err := offsets.NewKafka(kafka.ConfigMap{"bootstrap.servers": b.brokers}, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	defer k.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := k.Committed(ctx, b.group, []offsetstore.TP{{Topic: b.topic, Partition: 0}})
	if err != nil {
		b.t.Fatal(err)
	}
	if v, ok := c[offsetstore.TP{Topic: b.topic, Partition: 0}]; ok {
		return v
	}
	return -1
}

// tenWithPoisonAt3 produces ten messages whose offset 3 crashes the handler.
func (b *offsetsBundle) tenWithPoisonAt3() {
	vs := make([]string, 10)
	for i := range vs {
		vs[i] = "m" + strconv.Itoa(i)
	}
	vs[3] = "poison"
	b.produce(vs...)
}

// The service's end state after a skip of the poison pill at offset 3: everything else
// processed once, the pill never, both sides at 10, status aligned, accounting clean.
func (b *offsetsBundle) checkSkippedPoison(skipKind string) {
	b.t.Helper()
	if n := b.q(`SELECT count(*) FROM {{schema}}.effects WHERE "offset" = 3`); n != 0 {
		b.t.Fatal("the skipped poison pill was processed")
	}
	if n := b.q(`SELECT count(*) FROM {{schema}}.effects WHERE applied = 1`); n != 9 {
		b.t.Fatalf("%d messages processed exactly once, want 9", n)
	}
	if n := b.q(`SELECT count(*) FROM {{schema}}.effects WHERE applied <> 1`); n != 0 {
		b.t.Fatalf("%d messages processed more than once", n)
	}
	if w, k := b.watermark(), b.committed(); w != 10 || k != 10 {
		b.t.Fatalf("watermark %d, committed %d; want both 10", w, k)
	}
	st, code := b.status()
	if code != 0 || st.State != offsetstate.Aligned {
		b.t.Fatalf("status after the service followed: exit %d, state %s; want 0, aligned", code, st.State)
	}
	evs := b.audit()
	if n := countKind(evs, skipKind, 3, 4); n != 1 {
		b.t.Fatalf("%d applied %s rows for [3, 4), want 1: %+v", n, skipKind, evs)
	}
	other := offsetstore.KindUnexplainedSkip
	if skipKind == other {
		other = offsetstore.KindOperatorSkip
	}
	for _, e := range evs {
		if e.Kind == other {
			b.t.Fatalf("unexpected %s row: %+v", other, e)
		}
	}
	out, code := b.kafkatx("offsets", "account", "--group", b.group, "--topic", b.topic, "--output", "json")
	var a offsets.Account
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &a); err != nil {
		b.t.Fatalf("account output %q: %v", out, err)
	}
	skipped := a.OperatorSkipped
	if skipKind == offsetstore.KindUnexplainedSkip {
		skipped = a.UnexplainedSkipped
	}
	if code != 0 || a.Processed != 9 || skipped != 1 || a.Offsets != 10 || len(a.Gaps) != 0 {
		b.t.Fatalf("account: exit %d, %+v; want exit 0, 9 processed, 1 %s, no gap", code, a, skipKind)
	}
	// Issue 36: per group without --topic, as every other offsets command: the same report
	// (the group has a watermark on this topic only).
	if all, allCode := b.kafkatx("offsets", "account", "--group", b.group, "--output", "json"); allCode != code || all != out {
		b.t.Fatalf("offsets account without --topic: exit %d %q, want exit %d %q", allCode, all, code, out)
	}
}

func TestOffsetsOutOfBandSkipIsFollowedAndAudited(t *testing.T) {
	t.Parallel()
	b := offsetsSetup(t)
	b.tenWithPoisonAt3()
	b.runUntilStuck(3)
	if st, code := b.status(); code != 0 || st.State != offsetstate.Aligned || *st.Watermark != 3 {
		t.Fatalf("status of the stuck service: exit %d, %+v; want aligned at 3", code, st)
	}
	// On-call moves the group past the pill with Kafka's own tool, the service stopped.
	out, err := exec.Command(testenv.ConsumerGroupsTool(t), "--bootstrap-server", b.brokers, "--group", b.group,
		"--reset-offsets", "--topic", b.topic+":0", "--to-offset", "4", "--execute").CombinedOutput()
	if err != nil || strings.Contains(string(out), "Error") {
		t.Fatalf("kafka-consumer-groups --reset-offsets: %v\n%s", err, out)
	}
	st, code := b.status()
	if code != 3 || st.State != offsetstate.KafkaAhead || *st.Drift != 1 {
		t.Fatalf("status after the out-of-band reset: exit %d, state %s; want 3, kafka_ahead with drift 1", code, st.State)
	}
	// Issue "a user's first week" 4: the hint says starting the consumer skips [3, 4) for
	// good and quotes the command that keeps the message instead.
	text, _ := b.kafkatx("offsets", "status", "--group", b.group, "--topic", b.topic)
	for _, want := range []string{"SKIPS [3, 4) FOR GOOD", "kafkatx keeps no copy",
		fmt.Sprintf("kafkatx offsets reset --schema %s --group %s --topic %s --partition 0 --to-database", b.schema, b.group, b.topic)} {
		if !strings.Contains(text, want) {
			t.Fatalf("offsets status does not say %q:\n%s", want, text)
		}
	}
	b.runUntil(10)
	b.checkSkippedPoison(offsetstore.KindUnexplainedSkip)
	// The audit says where the skip is recorded and how to undo it.
	text, _ = b.kafkatx("offsets", "audit", "--group", b.group)
	if want := fmt.Sprintf("unexplained_skip %s[0] [3, 4): undo: stop the group's consumers, then `kafkatx offsets reset --schema %s --group %s --topic %s --partition 0 --to-offset 3 --mode replay",
		b.topic, b.schema, b.group, b.topic); !strings.Contains(text, want) {
		t.Fatalf("offsets audit does not quote the undo %q:\n%s", want, text)
	}
}

func TestOffsetsResetSkipMovesBothSides(t *testing.T) {
	t.Parallel()
	b := offsetsSetup(t)
	b.tenWithPoisonAt3()
	b.runUntilStuck(3)
	args := []string{"offsets", "reset", "--group", b.group, "--topic", b.topic, "--partition", "0", "--to-offset", "4", "--mode", "skip", "--reason", "poison pill at 3"}
	out, code := b.kafkatx(args...)
	if code != 0 || !strings.Contains(out, "skip [3, 4)") || !strings.Contains(out, "dry run") {
		t.Fatalf("dry run: exit %d, output %q", code, out)
	}
	if w, k, n := b.watermark(), b.committed(), b.q("SELECT count(*) FROM {{schema}}.offset_audit WHERE kind = 'operator_skip'"); w != 3 || k != 3 || n != 0 {
		t.Fatalf("the dry run changed something: watermark %d, committed %d, %d operator_skip rows", w, k, n)
	}
	if _, code := b.kafkatx(append(args, "--to-time", "2020-01-01T00:00:00Z")...); code == 0 {
		t.Fatal("two targets accepted")
	}
	if _, code := b.kafkatx("offsets", "reset", "--group", b.group, "--topic", b.topic, "--to-offset", "1", "--mode", "skip", "--reason", "x", "--execute"); code == 0 {
		t.Fatal("a skip below the watermark was accepted")
	}
	if _, code := b.kafkatx(append(args, "--execute")...); code != 0 {
		t.Fatalf("reset --execute exited %d", code)
	}
	if w, k := b.watermark(), b.committed(); w != 4 || k != 4 {
		t.Fatalf("after reset: watermark %d, committed %d; want both 4", w, k)
	}
	if st, code := b.status(); code != 0 || st.State != offsetstate.Aligned {
		t.Fatalf("status after reset: exit %d, %s; want aligned", code, st.State)
	}
	b.runUntil(10)
	b.checkSkippedPoison(offsetstore.KindOperatorSkip)
	for _, e := range b.audit() {
		if e.Kind == offsetstore.KindOperatorSkip && (e.Reason != "poison pill at 3" || !strings.Contains(e.Actor, "@")) {
			t.Fatalf("operator_skip row without reason or actor: %+v", e)
		}
	}
}

func TestOffsetsReplayToTimeRunsEachMessageOnceMore(t *testing.T) {
	t.Parallel()
	b := offsetsSetup(t)
	b.produce("a0", "a1", "a2", "a3", "a4")
	time.Sleep(1100 * time.Millisecond)
	at := time.Now()
	time.Sleep(1100 * time.Millisecond)
	b.produce("b5", "b6")
	b.produceKeyed(true, "b7", "b8", "b9") // with business idempotency keys
	b.runUntil(10)
	if n := b.q(`SELECT count(*) FROM {{schema}}.idempotency_keys WHERE key LIKE 'key-b%'`); n != 3 {
		t.Fatalf("%d business keys claimed, want 3 (is the key function wired?)", n)
	}
	_, code := b.kafkatx("offsets", "reset", "--group", b.group, "--topic", b.topic, "--to-time", at.UTC().Format(time.RFC3339Nano),
		"--mode", "replay", "--reason", "re-run after a bug fix", "--execute")
	if code != 0 {
		t.Fatalf("replay exited %d", code)
	}
	if w, k, e := b.watermark(), b.committed(), b.q("SELECT replay_epoch FROM {{schema}}.watermarks"); w != 5 || k != 5 || e != 1 {
		t.Fatalf("after replay: watermark %d, committed %d, epoch %d; want 5, 5, 1", w, k, e)
	}
	if st, code := b.status(); code != 0 || st.ReplayEpoch != 1 {
		t.Fatalf("status after replay: exit %d, %+v", code, st)
	}
	b.runUntil(10)
	if n := b.q(`SELECT count(*) FROM {{schema}}.effects WHERE "offset" < 5 AND applied = 1`); n != 5 {
		t.Fatalf("%d messages before the window ran exactly once, want 5", n)
	}
	if n := b.q(`SELECT count(*) FROM {{schema}}.effects WHERE "offset" >= 5 AND applied = 2`); n != 5 {
		t.Fatalf("%d messages in the window ran exactly twice (once more), want 5", n)
	}
	if n := countKind(b.audit(), offsetstore.KindReplay, 5, 10); n != 1 {
		t.Fatal("no applied replay row for [5, 10)")
	}
	if _, code := b.kafkatx("offsets", "account", "--group", b.group, "--topic", b.topic); code != 0 {
		t.Fatalf("account after a replay exited %d", code)
	}
}

// The broker describes a group of either protocol (classic, or consumer: KIP-848, which
// librdkafka's DescribeConsumerGroups asks with ConsumerGroupDescribe); a member of either
// makes the reset refuse.
func TestOffsetsResetRefusesWhileTheGroupHasAMember(t *testing.T) {
	t.Parallel()
	for _, proto := range []string{"classic", "consumer"} {
		t.Run(proto, func(t *testing.T) {
			t.Parallel()
			b := offsetsSetup(t)
			b.groupProtocol = proto
			testResetRefusedWithAMember(t, b)
		})
	}
}

func testResetRefusedWithAMember(t *testing.T, b *offsetsBundle) {
	b.produce("a", "b", "c", "d")
	s := b.start()
	b.waitFor("watermark 4", func() bool { return b.watermark() == 4 })
	for _, extra := range [][]string{nil, {"--execute"}} {
		out, code := b.kafkatx(append([]string{"offsets", "reset", "--group", b.group, "--topic", b.topic, "--to-earliest", "--mode", "replay", "--reason", "x"}, extra...)...)
		if code != 5 || !strings.Contains(out, "REFUSED") {
			t.Fatalf("reset %v with an active member: exit %d; want 5 and REFUSED", extra, code)
		}
	}
	if w, n := b.watermark(), b.q("SELECT count(*) FROM {{schema}}.offset_audit WHERE kind = 'replay'"); w != 4 || n != 0 {
		t.Fatalf("a refused reset changed something: watermark %d, %d replay rows", w, n)
	}
	b.stop(s)
	if _, code := b.kafkatx("offsets", "reset", "--group", b.group, "--topic", b.topic, "--to-earliest", "--mode", "replay", "--reason", "x", "--execute"); code != 0 {
		t.Fatalf("reset of the stopped group exited %d", code)
	}
	if w := b.watermark(); w != 0 {
		t.Fatalf("watermark %d after replay to earliest, want 0", w)
	}
}

func TestOffsetsStatusExitCodes(t *testing.T) {
	t.Parallel()
	b := offsetsSetup(t)
	b.produce("a", "b", "c", "d", "e", "f")
	b.runUntil(6)
	if st, code := b.status(); code != 0 || st.State != offsetstate.Aligned || st.Lag != 0 || st.LogEnd != 6 {
		t.Fatalf("aligned: exit %d, %+v", code, st)
	}
	k, err := offsets.NewKafka(kafka.ConfigMap{"bootstrap.servers": b.brokers}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	ctx := context.Background()
	tp := offsetstore.TP{Topic: b.topic, Partition: 0}
	if err := k.Commit(ctx, b.group, map[offsetstore.TP]int64{tp: 2}); err != nil {
		t.Fatal(err)
	}
	if st, code := b.status(); code != 3 || st.State != offsetstate.KafkaBehind || *st.Drift != -4 {
		t.Fatalf("Kafka behind: exit %d, %+v; want 3, kafka_behind, drift -4", code, st)
	}
	out, _ := b.kafkatx("offsets", "status", "--group", b.group, "--output", "prometheus")
	want := fmt.Sprintf(`kafkatx_offset_drift{group=%q,partition="0",topic=%q} -4`, b.group, b.topic)
	if !strings.Contains(out, want) {
		t.Fatalf("prometheus output lacks %s", want)
	}
	if _, code := b.kafkatx("offsets", "reset", "--group", b.group, "--topic", b.topic, "--to-database", "--reason", "re-commit", "--execute"); code != 0 {
		t.Fatalf("reset --to-database exited %d", code)
	}
	if st, code := b.status(); code != 0 || st.State != offsetstate.Aligned || b.committed() != 6 {
		t.Fatalf("after --to-database: exit %d, %+v", code, st)
	}
	if n := countKind(b.audit(), offsetstore.KindAlign, 2, 6); n != 1 {
		t.Fatal("no align row for [2, 6)")
	}
	admin, err := kafka.NewAdminClient(&kafka.ConfigMap{"bootstrap.servers": b.brokers})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.DeleteConsumerGroups(ctx, []string{b.group}); err != nil {
		t.Fatal(err)
	}
	if st, code := b.status(); code != 3 || st.State != offsetstate.KafkaMissing {
		t.Fatalf("group offsets deleted: exit %d, %+v; want 3, kafka_missing", code, st)
	}
}

func TestOffsetsAccountFindsAHandMadeGap(t *testing.T) {
	t.Parallel()
	b := offsetsSetup(t)
	b.produce("a", "b", "c", "d", "e", "f", "g", "h")
	b.runUntil(8)
	if _, code := b.kafkatx("offsets", "account", "--group", b.group, "--topic", b.topic); code != 0 {
		t.Fatalf("account of a clean run exited %d", code)
	}
	// Someone moves the watermark by hand, as "a quick fix".
	if _, err := b.pool.Exec(context.Background(), `UPDATE `+b.table("watermarks")+` SET next_offset = 11`); err != nil {
		t.Fatal(err)
	}
	out, code := b.kafkatx("offsets", "account", "--group", b.group, "--topic", b.topic, "--output", "json")
	var a offsets.Account
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &a); err != nil {
		t.Fatalf("account output %q: %v", out, err)
	}
	if code != 4 || len(a.Gaps) != 1 || a.Gaps[0].From != 8 || a.Gaps[0].To != 11 || a.Processed != 8 {
		t.Fatalf("account after a hand-made forward move: exit %d, %+v; want 4 with gap [8, 11)", code, a)
	}
	// A rewind by hand that even sets updated_at is caught too.
	if _, err := b.pool.Exec(context.Background(), `UPDATE `+b.table("watermarks")+` SET next_offset = 8, updated_at = now()`); err != nil {
		t.Fatal(err)
	}
	if n := b.q("SELECT count(*) FROM {{schema}}.offset_audit WHERE kind = 'unexplained_move' AND from_offset = 11 AND to_offset = 8"); n != 1 {
		t.Fatal("a hand-made rewind was not logged")
	}
	if _, code := b.kafkatx("offsets", "account", "--group", b.group, "--topic", b.topic); code != 4 {
		t.Fatalf("account after hand-made moves exited %d, want 4", code)
	}
}

// TestOffsetsStatusStalled: both sides agree (aligned), but records wait and the watermark
// has not moved for --stalled-after: the partition is stalled (a stuck handler, an open
// breaker, no consumer), never "aligned" with exit 0.
func TestOffsetsStatusStalled(t *testing.T) {
	t.Parallel()
	b := offsetsSetup(t)
	b.produce("a", "b", "c")
	b.runUntil(3)
	b.produce("d", "e") // nothing consumes them
	if st, code := b.status(); code != 0 || st.State != offsetstate.Aligned || st.Lag != 2 {
		t.Fatalf("lag 2 right after the last commit: exit %d, %+v; want 0 (not stalled yet)", code, st)
	}
	if _, err := b.pool.Exec(context.Background(), "UPDATE "+b.table("watermarks")+" SET updated_at = now() - interval '5 minutes' WHERE group_id = $1", b.group); err != nil {
		t.Fatal(err)
	}
	out, code := b.kafkatx("offsets", "status", "--group", b.group, "--topic", b.topic)
	if code != offsetsExitStalled || !strings.Contains(out, "aligned STALLED") || !strings.Contains(out, "STALLED: 1 of 1 partition(s)") {
		t.Fatalf("stalled: exit %d\n%s", code, out)
	}
	if _, code := b.kafkatx("offsets", "status", "--group", b.group, "--topic", b.topic, "--stalled-after", "10m"); code != 0 {
		t.Fatalf("--stalled-after 10m: exit %d, want 0", code)
	}
}
