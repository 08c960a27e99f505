package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/outbox"
	"github.com/kafkatx/kafkatx/outbox/relay"
)

// runRelay starts the relay on an outbox the parent pre-filled with s.Messages rows, reports
// how fast it drains them, then waits until the rows the parent inserts at an offered rate
// are published too (the parent reads their latency back from the topic).
func runRelay(ctx context.Context, s spec) error {
	started := time.Now()
	cpu0 := selfCPU()
	log := childLogger(s.Name)
	defer log.Sync() //nolint:errcheck
	pool, err := openPool(ctx, s, s.Schema, nil, 0)
	if err != nil {
		return err
	}
	defer pool.Close()
	rl, err := relay.New(pool, &relay.Config{Kafka: kafka.ConfigMap{"bootstrap.servers": s.Brokers}, Schema: s.Schema, Logger: log})
	if err != nil {
		return err
	}
	stopProfile, err := startProfile(s.CPUProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- rl.Run(runCtx) }()

	var t0 time.Time
	var p0 int64
	target := int64(s.Messages)
	err = waitFor(ctx, errc, "the outbox backlog", func() bool {
		n := rl.Stats().Published
		if n > 0 && t0.IsZero() {
			t0, p0 = time.Now(), n
		}
		return n >= target
	})
	if err != nil {
		return err
	}
	t1 := time.Now()
	stopProfile()
	drained := event{Event: "drained", Messages: rl.Stats().Published, FirstN: p0, Seconds: t1.Sub(t0).Seconds(),
		StartupSec: t0.Sub(started).Seconds(), ProcCPU: (selfCPU() - cpu0).Seconds(), GoHeapMB: goSysMB()}
	if drained.Seconds > 0 {
		drained.Rate = float64(target-p0) / drained.Seconds
	}
	if d, ok := backendCPU(ctx, pool, s.app()); ok {
		drained.PGCPU = d.Seconds()
	}
	emit(drained)

	n, _, err := readLatencyCount(ctx)
	if err != nil {
		return err
	}
	if n > 0 {
		want := target + n
		if err := waitFor(ctx, errc, "the paced rows", func() bool { return rl.Stats().Published >= want }); err != nil {
			return err
		}
	}
	res := event{Event: "result"}
	cancel()
	<-errc
	emit(res)
	return nil
}

// fillOutbox writes n order events into schema's outbox, 1000 rows per transaction, as the
// consumer phases' handler would (key = order id, a small JSON value).
func fillOutbox(ctx context.Context, pool *pgxpool.Pool, schema, topic string, n int) error {
	if err := kafkatx.Migrate(ctx, pool, schema); err != nil {
		return err
	}
	w := outbox.Writer{Schema: schema}
	run := fmt.Sprint(time.Now().UnixNano())
	for done := 0; done < n; done += 1000 {
		recs := make([]outbox.Record, 0, 1000)
		for i := done; i < min(done+1000, n); i++ {
			id := fmt.Sprintf("GEN-%s-%d", run, i)
			recs = append(recs, outbox.Record{Topic: topic, Key: []byte(id),
				Value: fmt.Appendf(nil, `{"order_id":%q,"customer":%q,"total_cents":%d}`, id, customers[i%len(customers)], 999*(1+i%5))})
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, err := w.WriteTx(ctx, tx, recs...); return err }); err != nil {
			return fmt.Errorf("fill outbox: %w", err)
		}
	}
	return nil
}

// paceOutbox inserts rate rows per second for d, in transactions every 10 ms, each row with
// headerProduced set to the time just before its INSERT, and returns how many it wrote.
func paceOutbox(ctx context.Context, pool *pgxpool.Pool, schema, topic string, rate float64, d time.Duration) (int, error) {
	w := outbox.Writer{Schema: schema}
	total := int(rate * d.Seconds())
	start := time.Now()
	sent := 0
	run := fmt.Sprint(time.Now().UnixNano())
	for sent < total {
		due := min(total, int(time.Since(start).Seconds()*rate)+1)
		if due > sent {
			recs := make([]outbox.Record, 0, due-sent)
			stamp := strconv.AppendInt(nil, time.Now().UnixNano(), 10)
			for i := sent; i < due; i++ {
				id := fmt.Sprintf("LAT-%s-%d", run, i)
				recs = append(recs, outbox.Record{Topic: topic, Key: []byte(id), Value: fmt.Appendf(nil, `{"order_id":%q}`, id),
					Headers: []outbox.Header{{Key: headerProduced, Value: stamp}}})
			}
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := w.WriteTx(ctx, tx, recs...)
				return err
			})
			if err != nil {
				return sent, fmt.Errorf("paced outbox rows: %w", err)
			}
			sent = due
		}
		time.Sleep(10 * time.Millisecond)
	}
	return sent, nil
}

// appendLatencies reads topic from the start to its end and returns, sorted, for each record
// with headerProduced, the time from that stamp to the record's timestamp — the broker's
// append time, since the topic is created with message.timestamp.type=LogAppendTime.
func appendLatencies(ctx context.Context, brokers, topic string, partitions int) ([]time.Duration, error) {
	kc, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": brokers, "group.id": "bench-reader-" + topic,
		"enable.auto.commit": false, "go.logs.channel.enable": false})
	if err != nil {
		return nil, err
	}
	defer kc.Close()
	var tps []kafka.TopicPartition
	left := 0
	for p := range partitions {
		_, high, err := kc.QueryWatermarkOffsets(topic, int32(p), 10000)
		if err != nil {
			return nil, fmt.Errorf("watermarks of %s[%d]: %w", topic, p, err)
		}
		left += int(high)
		tps = append(tps, kafka.TopicPartition{Topic: &topic, Partition: int32(p), Offset: kafka.OffsetBeginning})
	}
	if err := kc.Assign(tps); err != nil {
		return nil, err
	}
	var out []time.Duration
	for left > 0 {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		m, ok := kc.Poll(200).(*kafka.Message)
		if !ok {
			continue
		}
		left--
		for _, h := range m.Headers {
			if h.Key == headerProduced {
				if ns, err := strconv.ParseInt(string(h.Value), 10, 64); err == nil {
					out = append(out, m.Timestamp.Sub(time.Unix(0, ns)))
				}
			}
		}
	}
	slices.Sort(out)
	return out, nil
}
