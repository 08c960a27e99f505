package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/internal/offsets"
	"github.com/kafkatx/kafkatx/internal/offsetstate"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

// txProducer is a confluent-kafka-go transactional producer writing to every partition of a
// topic; each record's value says whether its transaction is to commit ("c/…") or abort
// ("a/…"), so the consumer's effects show which ones it applied.
type txProducer struct {
	t     *testing.T
	p     *kafka.Producer
	topic string
}

func newTxProducer(t *testing.T, brokers, topic, id string) *txProducer {
	t.Helper()
	p, err := kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": brokers, "transactional.id": id,
		"go.delivery.reports": false, "linger.ms": 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := p.InitTransactions(ctx); err != nil {
		t.Fatalf("init transactions of %s: %v", id, err)
	}
	return &txProducer{t: t, p: p, topic: topic}
}

func (x *txProducer) begin() {
	if err := x.p.BeginTransaction(); err != nil {
		x.t.Fatal(err)
	}
}

// write produces n records to each of partitions, tagged tag, and waits until they are in the
// log (still inside the open transaction).
func (x *txProducer) write(partitions, n int, tag string) {
	x.t.Helper()
	for part := 0; part < partitions; part++ {
		for i := 0; i < n; i++ {
			m := &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &x.topic, Partition: int32(part)}, Value: []byte(fmt.Sprintf("%s/%d/%d", tag, part, i))}
			if err := x.p.Produce(m, nil); err != nil {
				x.t.Fatal(err)
			}
		}
	}
	if left := x.p.Flush(30000); left != 0 {
		x.t.Fatalf("%d records not delivered", left)
	}
}

func (x *txProducer) end(commit bool) {
	x.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var err error
	if commit {
		err = x.p.CommitTransaction(ctx)
	} else {
		err = x.p.AbortTransaction(ctx)
	}
	if err != nil {
		x.t.Fatalf("end transaction (commit %v): %v", commit, err)
	}
}

// An input topic written by transactional producers: committed and aborted transactions of
// two producers interleaved in the same partitions, then a transaction left open while
// another commits behind it. With kafkatx's default isolation.level=read_committed, every
// committed record is applied exactly once and no aborted one; after the last marker the
// database watermark, Kafka's committed offset and the log end are the same offset on every
// partition (the markers take offsets the handler never sees: a watermark at "last record +
// 1" would stay one short for ever, librdkafka #3917); `offsets status` reports no drift and
// no lag while the consumer idles and after it stops; `offsets account` counts the markers'
// and aborted records' offsets as accounted, with no gap and no skip.
func TestTransactionalInputEndsAtTheLogEnd(t *testing.T) {
	b := offsetsSetup(t)
	const parts = 3
	b.topic = testenv.Topic(t, b.brokers, parts)
	ctx := context.Background()
	effects := b.table("tx_effects")
	if _, err := b.pool.Exec(ctx, `CREATE TABLE `+effects+` (partition int, "offset" bigint, value text, applied int NOT NULL, PRIMARY KEY (partition, "offset"))`); err != nil {
		t.Fatal(err)
	}
	start := func() *offsetsService {
		c, err := kafkatx.NewConsumer(b.pool, func(ctx context.Context, tx pgx.Tx, m *kafkatx.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+effects+` (partition, "offset", value, applied) VALUES ($1, $2, $3, 1)
				ON CONFLICT (partition, "offset") DO UPDATE SET applied = tx_effects.applied + 1`, m.Partition, m.Offset, string(m.Value))
			return err
		}, &kafkatx.Config{
			Kafka:  kafka.ConfigMap{"bootstrap.servers": b.brokers, "group.id": b.group, "session.timeout.ms": 6000, "heartbeat.interval.ms": 500},
			Topics: []string{b.topic},
			Schema: b.schema,
			Batch:  kafkatx.BatchConfig{Size: 7},
			Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)),
		})
		if err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithCancel(ctx)
		s := &offsetsService{cancel: cancel, done: make(chan error, 1)}
		go func() { s.done <- c.Run(cctx) }()
		t.Cleanup(func() { b.stop(s) })
		return s
	}
	committed := 0 // records of committed transactions, all partitions
	count := func(where string) int64 { return b.q(`SELECT count(*) FROM ` + effects + ` WHERE ` + where) }

	// Before the consumer starts: two producers, their transactions open at the same time in
	// the same partitions, one committing and the other aborting, in turns.
	pa := newTxProducer(t, b.brokers, b.topic, "txin-a-"+b.topic)
	pb := newTxProducer(t, b.brokers, b.topic, "txin-b-"+b.topic)
	for r := 0; r < 6; r++ {
		pa.begin()
		pb.begin()
		pa.write(parts, 4, fmt.Sprintf("c/a%d", r))
		pb.write(parts, 3, fmt.Sprintf("a/b%d", r))
		pa.write(parts, 2, fmt.Sprintf("c/a%d", r))
		pa.end(true)
		pb.end(false)
		committed += parts * 6
		if r%2 == 1 { // and a lone aborted transaction
			pb.begin()
			pb.write(parts, 5, fmt.Sprintf("a/b%d-alone", r))
			pb.end(false)
		}
	}
	s := start()
	b.waitFor("every committed record applied", func() bool { return count("true") >= int64(committed) })
	b.atLogEnd(parts)

	// While it runs: a transaction left open holds the last stable offset; a transaction
	// committed behind it is invisible until the open one ends (here: aborts). The watermark
	// waits at the open transaction's first record, which is where the log ended before.
	before := make([]int64, parts)
	for p := range before {
		before[p] = b.logEnd(int32(p))
	}
	pa.begin()
	pa.write(parts, 5, "a/open")
	pb.begin()
	pb.write(parts, 4, "c/behind")
	pb.end(true)
	committed += parts * 4
	time.Sleep(3 * time.Second)
	if n := count(`value LIKE 'c/behind/%'`); n != 0 {
		t.Fatalf("%d records applied past the last stable offset (an open transaction before them)", n)
	}
	for p := int32(0); p < parts; p++ {
		if w := b.watermarkOf(p); w != before[p] {
			t.Fatalf("partition %d: watermark %d while a transaction is open from offset %d", p, w, before[p])
		}
	}
	pa.end(false)
	b.waitFor("the records committed behind the open transaction", func() bool { return count("true") >= int64(committed) })
	b.atLogEnd(parts)

	// Idle: nothing drifts, nothing lags, for longer than the consumer's tick.
	time.Sleep(3 * time.Second)
	b.statusAligned(parts)
	b.stop(s)
	b.statusAligned(parts)

	if n := count("true"); n != int64(committed) {
		t.Fatalf("%d effects, want %d (the committed records)", n, committed)
	}
	if n := count(`value LIKE 'a/%'`); n != 0 {
		t.Fatalf("%d records of aborted transactions applied", n)
	}
	if n := count("applied <> 1"); n != 0 {
		t.Fatalf("%d records applied more than once", n)
	}
	if n := b.q(`SELECT count(*) FROM {{schema}}.offset_audit WHERE group_id = $1 AND kind NOT IN ('first_run')`, b.group); n != 0 {
		t.Fatalf("%d offset audit rows besides first_run: passing the markers must not look like a skip", n)
	}

	// Accounting: [0, log end) on each partition, every offset accounted (records, markers
	// and aborted records alike are offsets the loop moved over), no gap, no skip.
	out, code := b.kafkatx("offsets", "account", "--group", b.group, "--topic", b.topic, "--output", "json")
	if code != 0 {
		t.Fatalf("offsets account exited %d", code)
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	n := 0
	for sc.Scan() {
		var a offsets.Account
		if err := json.Unmarshal(sc.Bytes(), &a); err != nil {
			t.Fatalf("account line %q: %v", sc.Text(), err)
		}
		n++
		end := b.logEnd(a.Partition)
		if a.First != 0 || a.Watermark != end || a.Processed != end || len(a.Gaps) != 0 || a.UnexplainedSkipped != 0 || a.OperatorSkipped != 0 {
			t.Fatalf("partition %d: account %+v, want [0, %d) processed with no gap or skip", a.Partition, a, end)
		}
	}
	if n != parts {
		t.Fatalf("%d account lines, want %d", n, parts)
	}
}

// logEnd is partition p's log end offset (high watermark, read_uncommitted: every record and
// marker written).
func (b *offsetsBundle) logEnd(p int32) int64 {
	b.t.Helper()
	c, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": b.brokers, "group.id": "logend-" + b.group, "isolation.level": "read_uncommitted"})
	if err != nil {
		b.t.Fatal(err)
	}
	defer c.Close()
	_, high, err := c.QueryWatermarkOffsets(b.topic, p, 10000)
	if err != nil {
		b.t.Fatal(err)
	}
	return high
}

// atLogEnd waits until, on every partition, the database watermark and Kafka's committed
// offset both equal the log end offset.
func (b *offsetsBundle) atLogEnd(parts int) {
	b.t.Helper()
	for p := int32(0); p < int32(parts); p++ {
		end := b.logEnd(p)
		var w, k int64
		b.waitFor(fmt.Sprintf("partition %d: watermark and committed offset at the log end %d", p, end), func() bool {
			w = b.watermarkOf(p)
			k = b.committedOf(p)
			return w == end && k == end
		})
	}
}

func (b *offsetsBundle) committedOf(p int32) int64 {
	b.t.Helper()
	k, err := offsets.NewKafka(kafka.ConfigMap{"bootstrap.servers": b.brokers}, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	defer k.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tp := offsetstore.TP{Topic: b.topic, Partition: p}
	c, err := k.Committed(ctx, b.group, []offsetstore.TP{tp})
	if err != nil {
		b.t.Fatal(err)
	}
	if v, ok := c[tp]; ok {
		return v
	}
	return -1
}

func (b *offsetsBundle) watermarkOf(p int32) int64 {
	b.t.Helper()
	return b.q(`SELECT coalesce(max(next_offset), -1) FROM {{schema}}.watermarks WHERE group_id = $1 AND topic = $2 AND partition = $3`, b.group, b.topic, p)
}

// statusAligned runs `offsets status` and requires exit 0 and, on every partition, aligned
// with no drift and no lag.
func (b *offsetsBundle) statusAligned(parts int) {
	b.t.Helper()
	out, code := b.kafkatx("offsets", "status", "--group", b.group, "--topic", b.topic, "--output", "json")
	if code != 0 {
		b.t.Fatalf("offsets status exited %d, want 0 (aligned)", code)
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	n := 0
	for sc.Scan() {
		var s offsets.PartitionStatus
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			b.t.Fatalf("status line %q: %v", sc.Text(), err)
		}
		n++
		if s.State != offsetstate.Aligned || s.Drift == nil || *s.Drift != 0 || s.Lag != 0 || s.Watermark == nil || *s.Watermark != s.LogEnd {
			b.t.Fatalf("partition %d: status %s, want aligned, drift 0, lag 0, watermark = log end", s.Partition, sc.Text())
		}
	}
	if n != parts {
		b.t.Fatalf("%d status lines, want %d", n, parts)
	}
}
