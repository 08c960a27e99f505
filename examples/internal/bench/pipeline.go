package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kafkatx/kafkatx/examples/internal/topics"
	"github.com/kafkatx/kafkatx/examples/orders/order"
)

// The pipeline phases run the order service as examples/orders does (its flags' defaults,
// order.DefaultBatchSize, the relay in-process through examples/internal/service, its GC
// setting): "orders-noevents" without events and "e2e" with one event per order, on the same
// backlog size one after the other, so that their ratio compares like with like; the e2e
// child then takes the offered load with the relay running (-e2e-rate), which gives both
// latencies: produce -> committed effect (the commit probe) and produce -> published event
// (the event's broker append time, read back from the events topic).

// pipelinePair runs orders-noevents and e2e, and their ratio goes to the e2e row.
func (b *bench) pipelinePair(ctx context.Context) error {
	plain, err := b.pipeline(ctx, "orders-noevents", false, b.o.messages, false)
	if err != nil {
		return err
	}
	e2e, err := b.pipeline(ctx, "e2e", true, b.o.messages, b.o.latencySeconds > 0)
	if err != nil {
		return err
	}
	if plain.Rate > 0 {
		e2e.VsDrain = e2e.Rate / plain.Rate
		progress("e2e: %.0f msgs/s consumed, applied and published, %.2f of the drain without events (%.0f msgs/s)", e2e.Rate, e2e.VsDrain, plain.Rate)
	}
	b.rep.add(plain)
	b.rep.add(e2e)
	return nil
}

// e2eBacklog drains -e2e-backlog orders with events, for the example's peak RSS.
func (b *bench) e2eBacklog(ctx context.Context) error {
	if b.o.e2eBacklog <= 0 {
		return nil
	}
	r, err := b.pipeline(ctx, fmt.Sprintf("e2e-backlog-%d", b.o.e2eBacklog), true, b.o.e2eBacklog, false)
	if err != nil {
		return err
	}
	b.rep.add(r)
	return nil
}

// pipelineTopics creates s's topic, dead-letter topic and events topic, the last with
// LogAppendTime so that a record's timestamp is when the broker appended it.
func (b *bench) pipelineTopics(ctx context.Context, s spec) error {
	b.topics = append(b.topics, s.Topic, s.Topic+".dlq", s.EventsTopic)
	if err := createTopics(ctx, b.o.brokers, []string{s.Topic, s.Topic + ".dlq"}, b.o.partitions); err != nil {
		return err
	}
	return topics.Ensure(ctx, nil, kafka.ConfigMap{"bootstrap.servers": b.o.brokers}, []string{s.EventsTopic}, b.o.partitions, 1,
		map[string]string{"message.timestamp.type": "LogAppendTime"}, 30*time.Second)
}

// pipeline runs one pipeline phase over a backlog of n orders and returns its row.
func (b *bench) pipeline(ctx context.Context, name string, events bool, n int, latency bool) (row, error) {
	s := b.spec("pipeline", name)
	s.Batch, s.Messages, s.Events, s.Partitions, s.WithRelay = order.DefaultBatchSize, n, events, b.o.partitions, true
	r := row{Name: name, Kind: "pipeline", Batch: s.Batch, Events: events}
	if err := b.pipelineTopics(ctx, s); err != nil {
		return r, err
	}
	pr, err := newProducer(b.o.brokers, s.Topic)
	if err != nil {
		return r, err
	}
	defer pr.close()
	t0 := time.Now()
	if err := pr.backlog(ctx, n); err != nil {
		return r, err
	}
	progress("%s: produced %d in %s; draining as examples/orders runs (Batch.Size %d, relay in-process, events %v)",
		name, n, time.Since(t0).Round(time.Millisecond), s.Batch, events)
	if events {
		r.Note = "examples/orders' settings; consumed, applied and published, outbox empty"
	} else {
		r.Note = "examples/orders' settings, no events"
	}
	var from []int64
	res, err := b.child(ctx, s, &r, func(e event) (string, error) {
		r.AppliedSec, r.PeakBacklog = e.AppliedSec, e.PeakBacklog
		if events {
			progress("%s: applied in %.2fs, published in %.2fs; outbox peak %d orders not yet published", name, e.AppliedSec, e.Seconds, e.PeakBacklog)
		}
		if !latency {
			return "0", nil
		}
		wm, err := newWatermarks(b.o.brokers, s.EventsTopic, b.o.partitions)
		if err != nil {
			return "", err
		}
		from, err = wm.highs()
		wm.close()
		if err != nil {
			return "", err
		}
		r.Offered = b.o.e2eRate // not capped: the goal is set at this rate
		sent, err := pr.paced(ctx, r.Offered, time.Duration(b.o.latencySeconds*float64(time.Second)))
		if err != nil {
			return "", err
		}
		return strconv.Itoa(sent), nil
	}, nil)
	if err != nil {
		return r, err
	}
	r.fromResult(res)
	if latency && events {
		lat, err := publishedLatencies(ctx, b.o.brokers, s.EventsTopic, from, pr)
		if err != nil {
			return r, fmt.Errorf("read back the events: %w", err)
		}
		r.PubN, r.PubP50, r.PubP99, r.PubMax = len(lat), quantile(lat, 0.5), quantile(lat, 0.99), quantile(lat, 1)
	}
	if r.LatencyN > 0 {
		progress("%s: at %.0f msgs/s offered: produce -> effect p50 %.1f ms, p99 %.1f ms (%d); produce -> published p50 %.1f ms, p99 %.1f ms (%d)",
			name, r.Offered, r.P50, r.P99, r.LatencyN, r.PubP50, r.PubP99, r.PubN)
	}
	progress("%s: peak RSS %.0f MB", name, r.PeakRSSMB)
	return r, nil
}

// eventReader reads a topic from given offsets, for the events' append times.
type eventReader struct {
	kc  *kafka.Consumer
	pos []int64 // next offset per partition
}

func newEventReader(brokers, topic string, from []int64) (*eventReader, error) {
	kc, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": brokers, "group.id": "bench-reader-" + topic,
		"enable.auto.commit": false, "go.logs.channel.enable": false})
	if err != nil {
		return nil, err
	}
	var tps []kafka.TopicPartition
	for p, off := range from {
		tps = append(tps, kafka.TopicPartition{Topic: &topic, Partition: int32(p), Offset: kafka.Offset(off)})
	}
	if err := kc.Assign(tps); err != nil {
		kc.Close()
		return nil, err
	}
	return &eventReader{kc: kc, pos: append([]int64(nil), from...)}, nil
}

// poll returns the next record within ms milliseconds, or nil.
func (r *eventReader) poll(ms int) *kafka.Message {
	m, ok := r.kc.Poll(ms).(*kafka.Message)
	if !ok || m.TopicPartition.Error != nil {
		return nil
	}
	if p := int(m.TopicPartition.Partition); p < len(r.pos) {
		r.pos[p] = int64(m.TopicPartition.Offset) + 1
	}
	return m
}

// readTo reads until every partition's position reaches highs, calling fn for each record.
func (r *eventReader) readTo(ctx context.Context, highs []int64, fn func(*kafka.Message) error) error {
	behind := func() bool {
		for p, h := range highs {
			if r.pos[p] < h {
				return true
			}
		}
		return false
	}
	for behind() {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if m := r.poll(200); m != nil {
			if err := fn(m); err != nil {
				return err
			}
		}
	}
	return nil
}

func (r *eventReader) close() { r.kc.Close() }

// publishedLatency is the time from an order's produce call (pr's stamp, looked up by the
// event's key, the order id) to its event's broker append time; false for an event of an
// order pr did not stamp. A record without LogAppendTime is an error: its timestamp would be
// the relay's create time, not the publication.
func publishedLatency(m *kafka.Message, pr *producer) (time.Duration, bool, error) {
	ns, ok := pr.producedAt(m.Key)
	if !ok {
		return 0, false, nil
	}
	if m.TimestampType != kafka.TimestampLogAppendTime {
		return 0, false, fmt.Errorf("event on %s has timestamp type %v, not LogAppendTime", *m.TopicPartition.Topic, m.TimestampType)
	}
	return m.Timestamp.Sub(time.Unix(0, ns)), true, nil
}

// publishedLatencies reads topic from the offsets from to its end and returns, sorted, the
// produce -> published latency of each event of a stamped order.
func publishedLatencies(ctx context.Context, brokers, topic string, from []int64, pr *producer) ([]time.Duration, error) {
	wm, err := newWatermarks(brokers, topic, len(from))
	if err != nil {
		return nil, err
	}
	highs, err := wm.highs()
	wm.close()
	if err != nil {
		return nil, err
	}
	rd, err := newEventReader(brokers, topic, from)
	if err != nil {
		return nil, err
	}
	defer rd.close()
	var out []time.Duration
	err = rd.readTo(ctx, highs, func(m *kafka.Message) error {
		d, ok, err := publishedLatency(m, pr)
		if ok {
			out = append(out, d)
		}
		return err
	})
	sortDurations(out)
	return out, err
}

// window collects latencies between takes (goroutine-safe).
type window struct {
	mu  sync.Mutex
	lat []time.Duration
}

func (w *window) add(d time.Duration) {
	w.mu.Lock()
	w.lat = append(w.lat, d)
	w.mu.Unlock()
}

// take returns, sorted, what was added since the last take, and forgets it.
func (w *window) take() []time.Duration {
	w.mu.Lock()
	out := w.lat
	w.lat = nil
	w.mu.Unlock()
	sortDurations(out)
	return out
}
