package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/internal/offsets"
	"github.com/kafkatx/kafkatx/internal/offsetstate"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

// A failover with asynchronous replication: the standby that becomes the primary is behind, so
// the database comes back with an older watermark — and without the effects committed after
// it — while Kafka's committed offset kept the newer one. Staged with two real databases: the
// consumer drains into the primary, the "standby" is a pg_dump of the primary's schema taken
// in the middle (consistent, as a replica is), the consumer drains more, then it is restarted
// on the standby restored from that dump.
//
//   - `offsets status` on the standby reports the drift (exit 3, kafka_ahead, +200 per
//     partition) before anything runs.
//   - Under AheadHalt the consumer processes nothing and returns *kafkatx.OffsetAheadError,
//     with a halt audit row [W, K) per partition and an error log line; the operator moves
//     Kafka back to the database (`offsets reset --to-database`) and the lost messages run
//     again: every effect exactly once, nothing lost.
//   - Under the default (follow) policy the consumer follows Kafka: each lost range is one
//     unexplained_skip audit row [W, K), logged at error level and counted
//     (Stats.SkippedOffsets); the missing effects are exactly those ranges, so nothing is lost
//     without a record; `offsets account` lists them as unexplained skips (accounted, exit
//     0) and `offsets status` is aligned again.
func TestFailoverRollsTheWatermarkBackAndIsAudited(t *testing.T) {
	for _, tool := range []string{"pg_dump", "pg_restore"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: the PostgreSQL client tools are needed to stage the failover (%v)", tool, err)
		}
	}
	b := offsetsSetup(t)
	const parts, schema = 2, "kafkatx"
	b.topic = testenv.Topic(t, b.brokers, parts)
	b.schema = schema
	ctx := context.Background()
	primary := testenv.Database(t)
	primaryPool := poolOn(t, primary)
	if err := kafkatx.Migrate(ctx, primaryPool, schema); err != nil {
		t.Fatal(err)
	}
	effects := pgx.Identifier{schema, "effects"}.Sanitize()
	if _, err := primaryPool.Exec(ctx, `CREATE TABLE `+effects+` (partition int, "offset" bigint, applied int NOT NULL, PRIMARY KEY (partition, "offset"))`); err != nil {
		t.Fatal(err)
	}
	produceTo := func(from, to int) {
		var recs []string
		for i := from; i < to; i++ {
			recs = append(recs, fmt.Sprint(i))
		}
		b.producePartitions(parts, recs)
	}
	type service struct {
		c      *kafkatx.Consumer
		cancel context.CancelFunc
		done   chan error
		logs   *observer.ObservedLogs
	}
	start := func(pool *pgxpool.Pool, onAhead kafkatx.AheadPolicy) *service {
		core, logs := observer.New(zapcore.WarnLevel)
		c, err := kafkatx.NewConsumer(pool, func(ctx context.Context, tx pgx.Tx, m *kafkatx.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+effects+` (partition, "offset", applied) VALUES ($1, $2, 1)
				ON CONFLICT (partition, "offset") DO UPDATE SET applied = effects.applied + 1`, m.Partition, m.Offset)
			return err
		}, &kafkatx.Config{
			Kafka:        kafka.ConfigMap{"bootstrap.servers": b.brokers, "group.id": b.group, "session.timeout.ms": 6000, "heartbeat.interval.ms": 500},
			Topics:       []string{b.topic},
			Schema:       schema,
			OnKafkaAhead: onAhead,
			Logger:       zap.New(core),
		})
		if err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithCancel(ctx)
		s := &service{c: c, cancel: cancel, done: make(chan error, 1), logs: logs}
		go func() { s.done <- c.Run(cctx) }()
		t.Cleanup(func() { cancel(); <-s.done })
		return s
	}
	stop := func(s *service) {
		t.Helper()
		s.cancel()
		select {
		case err := <-s.done:
			s.done <- err // for the cleanup
			if err != nil {
				t.Fatalf("consumer stopped with %v", err)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("consumer did not stop within 60s")
		}
	}
	sumW := func(pool *pgxpool.Pool) int64 {
		var n int64
		_ = pool.QueryRow(ctx, `SELECT coalesce(sum(next_offset), 0) FROM `+pgx.Identifier{schema, "watermarks"}.Sanitize()+` WHERE group_id = $1`, b.group).Scan(&n)
		return n
	}
	committedAt := func(want int64) func() bool {
		return func() bool {
			for p := int32(0); p < parts; p++ {
				if b.committedOf(p) != want {
					return false
				}
			}
			return true
		}
	}

	// Drain 300 per partition into the primary, then take the standby's state.
	produceTo(0, 300)
	s := start(primaryPool, kafkatx.AheadFollow)
	b.waitFor("300 per partition on the primary", func() bool { return sumW(primaryPool) == 600 })
	b.waitFor("Kafka committed at 300", committedAt(300))
	dump := filepath.Join(t.TempDir(), "standby.dump")
	if out, err := exec.Command("pg_dump", "--format=custom", "--schema", schema, "--file", dump, primary).CombinedOutput(); err != nil {
		t.Fatalf("pg_dump: %v\n%s", err, out)
	}
	// 200 more per partition reach the primary (and Kafka's offsets), not the standby.
	produceTo(300, 500)
	b.waitFor("500 per partition on the primary", func() bool { return sumW(primaryPool) == 1000 })
	b.waitFor("Kafka committed at 500", committedAt(500))
	stop(s)
	standby := func() (string, *pgxpool.Pool) {
		url := testenv.Database(t)
		if out, err := exec.Command("pg_restore", "--dbname", url, dump).CombinedOutput(); err != nil {
			t.Fatalf("pg_restore: %v\n%s", err, out)
		}
		return url, poolOn(t, url)
	}

	// Halt: nothing runs; the operator aligns Kafka to the database and the lost messages
	// run again.
	t.Run("halt then align", func(t *testing.T) {
		url, pool := standby()
		b.dbURL = url
		b.expectStatus(parts, 3, offsetstate.KafkaAhead, 200)
		s := start(pool, kafkatx.AheadHalt)
		var err error
		select {
		case err = <-s.done:
			s.done <- err
		case <-time.After(60 * time.Second):
			t.Fatal("the consumer did not halt within 60 s")
		}
		var ahead *kafkatx.OffsetAheadError
		if !errors.As(err, &ahead) || ahead.Committed != 500 || ahead.Watermark != 300 {
			t.Fatalf("Run returned %v, want *kafkatx.OffsetAheadError 300 < 500", err)
		}
		if n := s.logs.FilterLevelExact(zapcore.ErrorLevel).FilterMessageSnippet("ahead of the database watermark").Len(); n == 0 {
			t.Fatal("no error log line about Kafka ahead of the database")
		}
		if n := countRows(t, pool, `SELECT count(*) FROM kafkatx.offset_audit WHERE group_id = $1 AND kind = 'halt' AND from_offset = 300 AND to_offset = 500`, b.group); n == 0 {
			t.Fatal("no halt audit row [300, 500)")
		}
		if n := countRows(t, pool, `SELECT count(*) FROM kafkatx.effects WHERE "offset" >= 300`); n != 0 {
			t.Fatalf("%d effects written while halted", n)
		}
		// The operator's repair, as docs/offsets.md says: Kafka back to the watermark.
		var code int
		b.waitFor("offsets reset --to-database (exit 0 once the group is empty)", func() bool {
			_, code = b.kafkatx("offsets", "reset", "--group", b.group, "--topic", b.topic, "--to-database", "--reason", "failover to a lagging standby", "--execute")
			return code == 0
		})
		s = start(pool, kafkatx.AheadHalt)
		b.waitFor("the lost messages processed again", func() bool { return sumW(pool) == 1000 })
		b.waitFor("Kafka committed at 500", committedAt(500))
		stop(s)
		if n := countRows(t, pool, `SELECT count(*) FROM kafkatx.effects WHERE applied = 1`); n != 1000 {
			t.Fatalf("%d effects applied once, want 1000", n)
		}
		if n := countRows(t, pool, `SELECT count(*) FROM kafkatx.effects WHERE applied <> 1`); n != 0 {
			t.Fatalf("%d effects applied more than once", n)
		}
		if n := countRows(t, pool, `SELECT count(*) FROM kafkatx.offset_audit WHERE group_id = $1 AND kind = 'align' AND from_offset = 500 AND to_offset = 300`, b.group); n != parts {
			t.Fatalf("%d align audit rows [500, 300), want %d", n, parts)
		}
		b.statusAligned(parts)
	})

	// Follow (the default): the lost range is skipped, and on record.
	t.Run("follow and audit", func(t *testing.T) {
		url, pool := standby()
		b.dbURL = url
		b.expectStatus(parts, 3, offsetstate.KafkaAhead, 200)
		s := start(pool, kafkatx.AheadFollow)
		b.waitFor("the skips audited", func() bool {
			return countRows(t, pool, `SELECT count(*) FROM kafkatx.offset_audit WHERE group_id = $1 AND kind = 'unexplained_skip'`, b.group) == parts
		})
		produceTo(500, 550) // the loop goes on after the skip
		b.waitFor("550 per partition on the standby", func() bool { return sumW(pool) == 1100 })
		b.waitFor("Kafka committed at 550", committedAt(550))
		if got := s.c.Stats().SkippedOffsets; got != 400 {
			t.Fatalf("Stats.SkippedOffsets %d, want 400", got)
		}
		if n := s.logs.FilterLevelExact(zapcore.ErrorLevel).FilterMessageSnippet("ahead of the database watermark").Len(); n != parts {
			t.Fatalf("%d error log lines about Kafka ahead of the database, want %d", n, parts)
		}
		stop(s)
		if n := countRows(t, pool, `SELECT count(*) FROM kafkatx.offset_audit WHERE group_id = $1 AND kind = 'unexplained_skip' AND from_offset = 300 AND to_offset = 500 AND status = 'applied'`, b.group); n != parts {
			t.Fatalf("%d unexplained_skip rows [300, 500), want %d", n, parts)
		}
		// Nothing lost without a record: every offset below the watermark has its effect or
		// lies in an audited skip, and the effects missing are exactly the audited ranges.
		if n := countRows(t, pool, `SELECT count(*) FROM kafkatx.watermarks w, generate_series(0, w.next_offset - 1) AS o
			WHERE w.group_id = $1
			  AND NOT EXISTS (SELECT 1 FROM kafkatx.effects e WHERE e.partition = w.partition AND e."offset" = o)
			  AND NOT EXISTS (SELECT 1 FROM kafkatx.offset_audit a WHERE a.group_id = w.group_id AND a.topic = w.topic AND a.partition = w.partition
			                    AND a.kind = 'unexplained_skip' AND o >= a.from_offset AND o < a.to_offset)`, b.group); n != 0 {
			t.Fatalf("%d offsets below the watermark with neither an effect nor an audit row", n)
		}
		if n := countRows(t, pool, `SELECT count(*) FROM kafkatx.effects WHERE "offset" >= 300 AND "offset" < 500`); n != 0 {
			t.Fatalf("%d effects inside the skipped ranges", n)
		}
		if n := countRows(t, pool, `SELECT count(*) FROM kafkatx.effects WHERE applied = 1`); n != 2*350 {
			t.Fatalf("%d effects, want 700 (300 before the dump and 50 after the failover, per partition)", n)
		}
		b.statusAligned(parts)
		out, code := b.kafkatx("offsets", "account", "--group", b.group, "--topic", b.topic, "--output", "json")
		if code != 0 {
			t.Fatalf("offsets account exited %d, want 0 (unexplained skips are accounted for)", code)
		}
		sc := bufio.NewScanner(strings.NewReader(out))
		for sc.Scan() {
			var a offsets.Account
			if err := json.Unmarshal(sc.Bytes(), &a); err != nil {
				t.Fatal(err)
			}
			if a.UnexplainedSkipped != 200 || len(a.UnexplainedSkips) != 1 || a.UnexplainedSkips[0].From != 300 || a.UnexplainedSkips[0].To != 500 || a.Processed != 350 || len(a.Gaps) != 0 {
				t.Fatalf("partition %d: account %s, want 350 processed and [300, 500) unexplained", a.Partition, sc.Text())
			}
		}
	})
}

func poolOn(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func countRows(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// producePartitions writes each value to every partition of b.topic, in order.
func (b *offsetsBundle) producePartitions(parts int, values []string) {
	b.t.Helper()
	p, err := kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": b.brokers, "enable.idempotence": true, "acks": "all", "linger.ms": 5})
	if err != nil {
		b.t.Fatal(err)
	}
	defer p.Close()
	ch := make(chan kafka.Event, parts*len(values))
	for part := 0; part < parts; part++ {
		for _, v := range values {
			m := &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &b.topic, Partition: int32(part)}, Value: []byte(v)}
			if err := p.Produce(m, ch); err != nil {
				b.t.Fatal(err)
			}
		}
	}
	for range parts * len(values) {
		if m := (<-ch).(*kafka.Message); m.TopicPartition.Error != nil {
			b.t.Fatal(m.TopicPartition.Error)
		}
	}
}

// expectStatus runs `offsets status` and requires the exit code and, on every partition, the
// state and drift given.
func (b *offsetsBundle) expectStatus(parts, wantCode int, state offsetstate.State, drift int64) {
	b.t.Helper()
	out, code := b.kafkatx("offsets", "status", "--group", b.group, "--topic", b.topic, "--output", "json")
	if code != wantCode {
		b.t.Fatalf("offsets status exited %d, want %d", code, wantCode)
	}
	n := 0
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var s offsets.PartitionStatus
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			b.t.Fatal(err)
		}
		n++
		if s.State != state || s.Drift == nil || *s.Drift != drift {
			b.t.Fatalf("partition %d: status %s, want %s with drift %+d", s.Partition, sc.Text(), state, drift)
		}
	}
	if n != parts {
		b.t.Fatalf("%d status lines, want %d", n, parts)
	}
}
