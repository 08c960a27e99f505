package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/examples/internal/service"
	"github.com/kafkatx/kafkatx/examples/orders/order"
	"github.com/kafkatx/kafkatx/outbox"
)

// runPipeline is the child of the pipeline phases (e2e, orders-noevents, the soak): the order
// service as examples/orders runs it — its consumer configuration (service.Flags with
// order.DefaultBatchSize, or s.Batch), the relay in-process through service.Run, its garbage
// collector setting (service.TuneGC) — with one event per applied order when s.Events.
//
// It drains s.Messages orders and reports the drain once every order is applied and, with
// events, every event is on the events topic (the sum of its partitions' high watermarks) and
// the outbox holds no pending row. Then it waits for the stamped orders the parent offers
// (their count on stdin) to be applied and published too, and reports their produce ->
// commit latencies; with s.SampleEvery > 0 (the soak) it also writes a "sample" line every
// SampleEvery seconds while they run.
func runPipeline(ctx context.Context, s spec) error {
	service.TuneGC() // as examples/orders runs
	started := time.Now()
	cpu0 := selfCPU()
	log := childLogger(s.Name)
	defer log.Sync() //nolint:errcheck
	probe := newCommitProbe()
	pool, err := openPool(ctx, s, s.Schema, probe, service.DefaultMaxConns) // as service.OpenPools sizes it
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := prepareOrders(ctx, pool, s.Schema); err != nil {
		return err
	}
	events := ""
	if s.Events {
		events = s.EventsTopic
	}
	svc := &order.Service{EventsTopic: events, WriteEvents: outbox.Writer{Schema: s.Schema}.WriteTx}
	// The example's own flags, as examples/orders registers their defaults.
	f := service.Flags{Brokers: s.Brokers, Topic: s.Topic, Group: s.Group, Schema: s.Schema, MaxAttempts: 5, BatchSize: s.Batch}
	reg := prometheus.NewRegistry()
	ccfg := f.ConsumerConfig(log, reg)
	ccfg.SkipMigrations = true // applied above
	ccfg.Backpressure = outbox.Writer{Schema: s.Schema}.WaitBelow(pool, int64(s.MaxOutbox))
	c, err := kafkatx.NewBatchConsumer(pool, handler(svc, probe), ccfg)
	if err != nil {
		return err
	}
	wm, err := newWatermarks(s.Brokers, s.EventsTopic, s.Partitions)
	if err != nil {
		return err
	}
	defer wm.close()
	pending := func(ctx context.Context) (int64, error) {
		var n int64
		err := pool.QueryRow(ctx, `SELECT coalesce(sum(pack_count), 0) FROM `+outbox.Table(s.Schema)+` WHERE state IN ('pending', 'parked', 'packed')`).Scan(&n)
		return n, err
	}

	stopProfile, err := startProfile(s.CPUProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		errc <- service.Run(runCtx, service.Options{Pool: pool, Consumer: c, Brokers: s.Brokers, Schema: s.Schema,
			KafkaConfig: f.ClientConfig(), Logger: log, Registry: reg})
	}()

	target := int64(s.Messages)
	var peak int64 // most orders committed but not yet on the events topic, sampled every 100 ms
	lastSample := time.Time{}
	err = waitFor(ctx, errc, "the backlog to be applied", func() bool {
		done := probe.committed.Load() >= target
		if s.Events && (done || time.Since(lastSample) >= 100*time.Millisecond) {
			lastSample = time.Now()
			if pub, err := wm.count(); err == nil {
				peak = max(peak, probe.committed.Load()-pub)
			}
		}
		return done
	})
	if err != nil {
		return err
	}
	applied := time.Unix(0, probe.lastAt.Load())
	end := applied
	if s.Events {
		if end, err = waitPublished(ctx, errc, wm, pending, target); err != nil {
			return err
		}
	}
	stopProfile()
	first := time.Unix(0, probe.firstAt.Load())
	drained := event{Event: "drained", Messages: probe.committed.Load(), FirstN: probe.firstN.Load(),
		Seconds: end.Sub(first).Seconds(), AppliedSec: applied.Sub(first).Seconds(), PeakBacklog: peak,
		StartupSec: first.Sub(started).Seconds(), ProcCPU: (selfCPU() - cpu0).Seconds(), GoHeapMB: goSysMB()}
	if drained.Seconds > 0 {
		drained.Rate = float64(drained.Messages-drained.FirstN) / drained.Seconds
	}
	if d, ok := backendCPU(ctx, pool, s.app()); ok {
		drained.PGCPU = d.Seconds()
	}
	drained.Batches, drained.BatchSec = batchHistogram(reg)
	if rs := relayRounds(reg); rs.Rounds > 0 {
		drained.Relay = &rs
	}
	emit(drained)

	// The soak's samples run from now until the offered load is applied and published.
	sampling := make(chan struct{})
	var sampled sync.WaitGroup
	if s.SampleEvery > 0 {
		probe.take() // the drain's latencies are not the soak's
		sampled.Add(1)
		go func() {
			defer sampled.Done()
			sampleLoop(ctx, sampling, time.Duration(s.SampleEvery*float64(time.Second)), probe, wm, pending, s.Events)
		}()
	}
	n, _, err := readLatencyCount(ctx)
	if err == nil && n > 0 {
		want := target + n
		err = waitFor(ctx, errc, "the stamped messages", func() bool { return probe.committed.Load() >= want })
		if err == nil && s.Events {
			_, err = waitPublished(ctx, errc, wm, pending, want)
		}
	}
	close(sampling)
	sampled.Wait()
	if err != nil {
		return err
	}
	res := event{Event: "result"}
	if s.SampleEvery <= 0 {
		lat := probe.latencies()
		res.Latency, res.P50, res.P99, res.MaxMs = len(lat), quantile(lat, 0.50), quantile(lat, 0.99), quantile(lat, 1)
	}
	stopAndEmit(log, cancel, errc, "service", res)
	return nil
}

// waitPublished polls, every 5 ms, until the events topic holds want records and then until
// the outbox holds no pending row; it returns when both were seen.
func waitPublished(ctx context.Context, errc <-chan error, wm *watermarks, pending func(context.Context) (int64, error), want int64) (time.Time, error) {
	var werr error
	err := waitForEvery(ctx, errc, 5*time.Millisecond, "the events to be published", func() bool {
		n, err := wm.count()
		if werr = err; err != nil {
			return true
		}
		return n >= want
	})
	if err == nil && werr == nil {
		err = waitForEvery(ctx, errc, 5*time.Millisecond, "the outbox to be empty", func() bool {
			n, err := pending(ctx)
			if werr = err; err != nil {
				return true
			}
			return n == 0
		})
	}
	if err == nil {
		err = werr
	}
	return time.Now(), err
}

// sampleLoop writes a "sample" line every every until stop closes (and a last one then): the
// process's resident set (VmRSS), the produce -> commit latencies of the window, the orders
// committed but not yet published and the pending outbox rows.
func sampleLoop(ctx context.Context, stop <-chan struct{}, every time.Duration, probe *commitProbe, wm *watermarks,
	pending func(context.Context) (int64, error), events bool) {
	start := time.Now()
	t := time.NewTicker(every)
	defer t.Stop()
	one := func() {
		lat := probe.take()
		e := event{Event: "sample", Seconds: time.Since(start).Seconds(), RSSMB: vmRSS(), GoHeapMB: goSysMB(),
			Latency: len(lat), P50: quantile(lat, 0.5), P99: quantile(lat, 0.99), MaxMs: quantile(lat, 1),
			Messages: probe.committed.Load()}
		if events {
			if n, err := pending(ctx); err == nil {
				e.OutboxRows = n
			}
			if pub, err := wm.count(); err == nil {
				e.Published = pub
			}
		}
		emit(e)
	}
	for {
		select {
		case <-stop:
			one()
			return
		case <-ctx.Done():
			return
		case <-t.C:
			one()
		}
	}
}

// watermarks counts the records on a topic: the sum over its partitions of high minus low
// watermark, queried from the broker.
type watermarks struct {
	c          *kafka.Consumer
	topic      string
	partitions int
}

func newWatermarks(brokers, topic string, partitions int) (*watermarks, error) {
	c, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": brokers, "group.id": "bench-watermarks-" + topic,
		"enable.auto.commit": false, "go.logs.channel.enable": false})
	if err != nil {
		return nil, fmt.Errorf("watermarks: %w", err)
	}
	return &watermarks{c: c, topic: topic, partitions: partitions}, nil
}

func (w *watermarks) count() (int64, error) {
	var sum int64
	for p := range w.partitions {
		low, high, err := w.query(p)
		if err != nil {
			return 0, err
		}
		sum += high - low
	}
	return sum, nil
}

// highs returns each partition's high watermark.
func (w *watermarks) highs() ([]int64, error) {
	out := make([]int64, w.partitions)
	for p := range w.partitions {
		_, high, err := w.query(p)
		if err != nil {
			return nil, err
		}
		out[p] = high
	}
	return out, nil
}

// query asks for partition p's watermarks, trying again for up to 10 s while the broker
// answers with a retriable error (a topic just created has no leader yet).
func (w *watermarks) query(p int) (low, high int64, err error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		low, high, err = w.c.QueryWatermarkOffsets(w.topic, int32(p), 5000)
		var kerr kafka.Error
		if err == nil || !errors.As(err, &kerr) || !retriableKafka(kerr) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("watermarks of %s[%d]: %w", w.topic, p, err)
	}
	return low, high, nil
}

// retriableKafka reports an error the broker may stop giving on its own: librdkafka's
// retriable flag, or a partition without a leader yet.
func retriableKafka(e kafka.Error) bool {
	switch e.Code() {
	case kafka.ErrNotLeaderForPartition, kafka.ErrLeaderNotAvailable, kafka.ErrUnknownTopicOrPart, kafka.ErrTimedOut, kafka.ErrTransport:
		return true
	}
	return e.IsRetriable()
}

func (w *watermarks) close() { w.c.Close() }
