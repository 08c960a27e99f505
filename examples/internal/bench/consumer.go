package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/examples/internal/service"
	"github.com/kafkatx/kafkatx/examples/orders/order"
	"github.com/kafkatx/kafkatx/outbox"
	"github.com/kafkatx/kafkatx/outbox/relay"
)

// runConsumer drains s.Messages with the naive loop or kafkatx, reports the drain, then
// waits for the stamped messages the parent produces at an offered rate and reports their
// produce -> commit latencies.
func runConsumer(ctx context.Context, s spec) error {
	if s.WithRelay {
		service.TuneGC() // as examples/orders runs
	}
	started := time.Now()
	cpu0 := selfCPU()
	log := childLogger(s.Name)
	defer log.Sync() //nolint:errcheck
	probe := newCommitProbe()
	pool, err := openPool(ctx, s, s.Schema, probe, 0)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := prepareOrders(ctx, pool, s.Schema); err != nil {
		return err
	}
	svc := &order.Service{EventsTopic: s.EventsTopic, WriteEvents: outbox.Writer{Schema: s.Schema}.WriteTx}
	handle := handler(svc, probe)

	stopProfile, err := startProfile(s.CPUProfile)
	if err != nil {
		return err
	}
	defer stopProfile()

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 2)
	reg := prometheus.NewRegistry()
	switch s.Phase {
	case "naive":
		go func() { errc <- naiveLoop(runCtx, pool, handle, s) }()
	default:
		kcfg := kafka.ConfigMap{"bootstrap.servers": s.Brokers, "group.id": s.Group}
		for k, v := range s.KafkaExtra {
			kcfg[k] = v
		}
		c, err := kafkatx.NewBatchConsumer(pool, handle, &kafkatx.Config{
			Kafka:      kcfg,
			Topics:     []string{s.Topic},
			Schema:     s.Schema,
			Logger:     log,
			Batch:      kafkatx.BatchConfig{Size: s.Batch},
			Registerer: reg,
		})
		if err != nil {
			return err
		}
		go func() { errc <- c.Run(runCtx) }()
		if s.WithRelay {
			// As examples/orders: the relay publishes the order events in-process.
			rl, err := relay.New(pool, &relay.Config{Kafka: kafka.ConfigMap{"bootstrap.servers": s.Brokers}, Schema: s.Schema, Logger: log})
			if err != nil {
				return err
			}
			go func() { _ = rl.Run(runCtx) }()
		}
	}

	target := int64(s.Messages)
	if err := waitFor(ctx, errc, "the backlog", func() bool { return probe.committed.Load() >= target }); err != nil {
		return err
	}
	stopProfile()
	first, last := time.Unix(0, probe.firstAt.Load()), time.Unix(0, probe.lastAt.Load())
	drained := event{Event: "drained", Messages: probe.committed.Load(), FirstN: probe.firstN.Load(),
		Seconds: last.Sub(first).Seconds(), StartupSec: first.Sub(started).Seconds(),
		ProcCPU: (selfCPU() - cpu0).Seconds(), GoHeapMB: goSysMB()}
	if drained.Seconds > 0 {
		drained.Rate = float64(drained.Messages-drained.FirstN) / drained.Seconds
	}
	if d, ok := backendCPU(ctx, pool, s.app()); ok {
		drained.PGCPU = d.Seconds()
	}
	drained.Batches, drained.BatchSec = batchHistogram(reg)
	emit(drained)

	n, _, err := readLatencyCount(ctx)
	if err != nil {
		return err
	}
	res := event{Event: "result"}
	if n > 0 {
		want := drained.Messages + n
		if err := waitFor(ctx, errc, "the stamped messages", func() bool { return probe.committed.Load() >= want }); err != nil {
			return err
		}
		lat := probe.latencies()
		res.Latency, res.P50, res.P99 = len(lat), quantile(lat, 0.50), quantile(lat, 0.99)
		if len(lat) > 0 {
			res.MaxMs = quantile(lat, 1)
		}
	}
	stopAndEmit(log, cancel, errc, "consumer", res)
	return nil
}

// stopAndEmit cancels the phase's loop, waits up to 60 s for it to end (logging an error it
// ended with, other than the cancellation), and writes res.
func stopAndEmit(log *zap.Logger, cancel context.CancelFunc, errc <-chan error, what string, res event) {
	cancel()
	select {
	case err := <-errc:
		if err != nil && !errors.Is(err, context.Canceled) {
			log.Warn(what+" stopped with an error", zap.Error(err))
		}
	case <-time.After(60 * time.Second):
		log.Warn(what + " did not stop within 60s")
	}
	emit(res)
}

// naiveLoop is the loop users write by hand with confluent-kafka-go: for each message, one
// database transaction with the order service's writes, then a synchronous offset commit.
func naiveLoop(ctx context.Context, pool *pgxpool.Pool, handle kafkatx.BatchHandler, s spec) error {
	kc, err := kafka.NewConsumer(&kafka.ConfigMap{
		"bootstrap.servers": s.Brokers, "group.id": s.Group,
		"enable.auto.commit": false, "auto.offset.reset": "earliest",
		"go.logs.channel.enable": false,
	})
	if err != nil {
		return fmt.Errorf("naive: consumer: %w", err)
	}
	defer kc.Close()
	if err := kc.SubscribeTopics([]string{s.Topic}, nil); err != nil {
		return fmt.Errorf("naive: subscribe: %w", err)
	}
	for ctx.Err() == nil {
		km, ok := kc.Poll(100).(*kafka.Message)
		if !ok {
			continue
		}
		m := &kafkatx.Message{Topic: *km.TopicPartition.Topic, Partition: km.TopicPartition.Partition,
			Offset: int64(km.TopicPartition.Offset), Key: km.Key, Value: km.Value, Timestamp: km.Timestamp}
		for _, h := range km.Headers {
			m.Headers = append(m.Headers, kafkatx.Header{Key: h.Key, Value: h.Value})
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			return fmt.Errorf("naive: begin: %w", err)
		}
		if err := handle(ctx, tx, []*kafkatx.Message{m}); err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			return fmt.Errorf("naive: handle offset %d: %w", m.Offset, err)
		}
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("naive: commit: %w", err)
		}
		if _, err := kc.CommitMessage(km); err != nil {
			return fmt.Errorf("naive: commit offset: %w", err)
		}
	}
	return nil
}

// batchHistogram reads kafkatx_batch_duration_seconds: how many batch transactions committed
// and their total time (summed over partitions).
func batchHistogram(reg *prometheus.Registry) (int64, float64) {
	mfs, err := reg.Gather()
	if err != nil {
		return 0, 0
	}
	for _, mf := range mfs {
		if mf.GetName() != "kafkatx_batch_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if h := m.GetHistogram(); h != nil {
				return int64(h.GetSampleCount()), h.GetSampleSum()
			}
		}
	}
	return 0, 0
}

// relaySteps is where the relay's leader spent its rounds (relay.HookRound, through its
// Prometheus counters): seconds waiting for rows, producing until the last delivery report,
// and waiting for the previous round's mark.
type relaySteps struct {
	Rounds   int64   `json:"rounds,omitempty"`
	Read     float64 `json:"read_s,omitempty"`
	Produce  float64 `json:"produce_s,omitempty"`
	MarkWait float64 `json:"mark_wait_s,omitempty"`
}

// relayRounds reads relaySteps from reg (zero when the relay registered nothing there).
func relayRounds(reg *prometheus.Registry) relaySteps {
	var out relaySteps
	mfs, err := reg.Gather()
	if err != nil {
		return out
	}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "kafkatx_outbox_relay_rounds_total":
			for _, m := range mf.GetMetric() {
				out.Rounds += int64(m.GetCounter().GetValue())
			}
		case "kafkatx_outbox_relay_round_seconds_total":
			for _, m := range mf.GetMetric() {
				v := m.GetCounter().GetValue()
				for _, l := range m.GetLabel() {
					if l.GetName() != "step" {
						continue
					}
					switch l.GetValue() {
					case "read":
						out.Read += v
					case "produce":
						out.Produce += v
					case "mark_wait":
						out.MarkWait += v
					}
				}
			}
		}
	}
	return out
}
