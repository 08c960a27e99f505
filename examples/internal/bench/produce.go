package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kafkatx/kafkatx/examples/internal/topics"
)

// producer sends orders the way examples/orders --generate does: idempotent, acks=all,
// linger.ms=5, keyed by order id.
type producer struct {
	p      *kafka.Producer
	topic  string
	run    string
	next   int
	failed atomic.Int64
	first  atomic.Pointer[error]
	done   chan struct{}

	// The produce stamps of the stamped messages, in order: stamps[i] is message stampBase+i's
	// (orderValue's sequence number). The pipeline phases look up an order event's produce
	// time by its key, the order id, so the example's events need no header of their own.
	mu        sync.Mutex
	stampBase int
	stamps    []int64
}

func newProducer(brokers, topic string) (*producer, error) {
	return newProducerWith(brokers, topic, nil)
}

// newTxProducer is newProducer in one Kafka transaction (transactional.id txID, begun):
// consumers that read committed (kafkatx sets isolation.level=read_committed) see none of
// its records until commit, then all of them at once.
func newTxProducer(ctx context.Context, brokers, topic, txID string) (*producer, error) {
	pr, err := newProducerWith(brokers, topic, kafka.ConfigMap{"transactional.id": txID})
	if err != nil {
		return nil, err
	}
	if err := pr.p.InitTransactions(ctx); err != nil {
		pr.close()
		return nil, fmt.Errorf("producer: init transactions: %w", err)
	}
	if err := pr.p.BeginTransaction(); err != nil {
		pr.close()
		return nil, fmt.Errorf("producer: begin transaction: %w", err)
	}
	return pr, nil
}

// commit commits newTxProducer's transaction.
func (pr *producer) commit(ctx context.Context) error {
	if err := pr.p.CommitTransaction(ctx); err != nil {
		return fmt.Errorf("producer: commit transaction: %w", err)
	}
	return nil
}

func newProducerWith(brokers, topic string, extra kafka.ConfigMap) (*producer, error) {
	cfg := kafka.ConfigMap{
		"bootstrap.servers": brokers, "enable.idempotence": true, "acks": "all", "linger.ms": 5,
		"go.logs.channel.enable": false,
	}
	for k, v := range extra {
		cfg[k] = v
	}
	p, err := kafka.NewProducer(&cfg)
	if err != nil {
		return nil, fmt.Errorf("producer: %w", err)
	}
	pr := &producer{p: p, topic: topic, run: strconv.FormatInt(time.Now().UnixNano(), 36), done: make(chan struct{})}
	go func() {
		defer close(pr.done)
		for e := range p.Events() {
			if m, ok := e.(*kafka.Message); ok && m.TopicPartition.Error != nil {
				pr.failed.Add(1)
				err := m.TopicPartition.Error
				pr.first.CompareAndSwap(nil, &err)
			}
		}
	}()
	return pr, nil
}

// send produces one order; stamp adds headerProduced with the time of the call.
func (pr *producer) send(stamp bool) error {
	pr.next++
	key, value := orderValue(pr.run, pr.next)
	m := &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &pr.topic, Partition: kafka.PartitionAny}, Key: key, Value: value}
	for {
		var ns int64
		if stamp {
			ns = time.Now().UnixNano()
			m.Headers = []kafka.Header{{Key: headerProduced, Value: strconv.AppendInt(nil, ns, 10)}}
		}
		err := pr.p.Produce(m, nil)
		if err == nil {
			if stamp {
				pr.mu.Lock()
				if len(pr.stamps) == 0 {
					pr.stampBase = pr.next
				}
				if pr.next == pr.stampBase+len(pr.stamps) {
					pr.stamps = append(pr.stamps, ns)
				}
				pr.mu.Unlock()
			}
			return nil
		}
		var kerr kafka.Error
		if errors.As(err, &kerr) && kerr.Code() == kafka.ErrQueueFull {
			time.Sleep(time.Millisecond)
			continue
		}
		return fmt.Errorf("produce: %w", err)
	}
}

// producedAt is the produce stamp of the stamped order whose id is key (as orderValue
// writes it: GEN-<run>-<sequence>), if this producer sent it stamped.
func (pr *producer) producedAt(key []byte) (int64, bool) {
	seq, ok := orderSeq(key, pr.run)
	if !ok {
		return 0, false
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if i := seq - pr.stampBase; len(pr.stamps) > 0 && i >= 0 && i < len(pr.stamps) {
		return pr.stamps[i], true
	}
	return 0, false
}

// orderSeq parses an order id GEN-<run>-<sequence> of run; false for any other id.
func orderSeq(key []byte, run string) (int, bool) {
	rest, ok := strings.CutPrefix(string(key), "GEN-"+run+"-")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	return n, err == nil && n >= 0
}

// backlog produces n orders as fast as the producer takes them and waits for every delivery.
func (pr *producer) backlog(ctx context.Context, n int) error {
	for i := 0; i < n; i++ {
		if err := pr.send(false); err != nil {
			return err
		}
	}
	return pr.flush(ctx)
}

// paced produces rate orders per second for d, stamped with their produce time, and waits
// for every delivery. It returns how many it produced.
func (pr *producer) paced(ctx context.Context, rate float64, d time.Duration) (int, error) {
	total := int(rate * d.Seconds())
	start := time.Now()
	sent := 0
	for sent < total {
		due := min(total, int(time.Since(start).Seconds()*rate)+1)
		for ; sent < due; sent++ {
			if err := pr.send(true); err != nil {
				return sent, err
			}
		}
		time.Sleep(500 * time.Microsecond)
	}
	return sent, pr.flush(ctx)
}

func (pr *producer) flush(ctx context.Context) error {
	for pr.p.Flush(1000) > 0 {
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	if e := pr.first.Load(); e != nil {
		return fmt.Errorf("delivery (%d failed): %w", pr.failed.Load(), *e)
	}
	return nil
}

func (pr *producer) close() {
	pr.p.Close()
	<-pr.done
}

// createTopics creates fresh topics with partitions partitions (replication 1).
func createTopics(ctx context.Context, brokers string, names []string, partitions int) error {
	return topics.Ensure(ctx, nil, kafka.ConfigMap{"bootstrap.servers": brokers}, names, partitions, 1, nil, 30*time.Second)
}

// deleteTopics removes the run's topics; errors are reported, not fatal.
func deleteTopics(ctx context.Context, brokers string, names []string) error {
	if len(names) == 0 {
		return nil
	}
	admin, err := kafka.NewAdminClient(&kafka.ConfigMap{"bootstrap.servers": brokers})
	if err != nil {
		return err
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res, err := admin.DeleteTopics(ctx, names)
	if err != nil {
		return err
	}
	for _, r := range res {
		if r.Error.Code() != kafka.ErrNoError && r.Error.Code() != kafka.ErrUnknownTopicOrPart {
			return fmt.Errorf("delete topic %s: %w", r.Topic, r.Error)
		}
	}
	return nil
}
