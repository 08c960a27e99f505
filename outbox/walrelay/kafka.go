package walrelay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pglogrepl"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/kafkaname"
	"github.com/kafkatx/kafkatx/outbox/internal/publish"
)

// kafkaSide is one stream's transactional producer and the checkpoint it writes.
type kafkaSide struct {
	cfg     Config
	p       *kafka.Producer
	key     []byte // checkpoint key: "<system id>/<database>/<slot>"
	reports bool   // per-record delivery reports (to find a refused record)
	log     *zap.Logger
	wg      sync.WaitGroup
	topics  map[string]int // partition count; -1 when the topic does not exist
	checked map[string]time.Time
	limits  map[string]publish.Limits // zero when they could not be read
	batch   int                       // librdkafka batch.size of this producer

	produced, reported atomic.Int64
	acked              atomic.Int64
	mu                 sync.Mutex
	failure            *deliveryFailure // the first failed delivery of the open transaction
	failed             []position       // every failed record's position (reports on)
	fatal              atomic.Pointer[kafka.Error]
	reach              *publish.Reach // whether the brokers answer (Relay.Ready)
}

type deliveryFailure struct {
	at  position
	err kafka.Error
	all []position // every record that failed with it (a refused batch fails them all)
}

// checkpoint is the value of a checkpoint record: the commit LSN of the last transaction
// published, the timeline that commit was written on and the cluster's system identifier
// (a promoted standby keeps it; only the timeline changes). Timeline and SystemID are absent
// from checkpoints written before kafkatx recorded them.
type checkpoint struct {
	CommitLSN string    `json:"commit_lsn"`
	Timeline  uint32    `json:"timeline,omitempty"`
	SystemID  string    `json:"system_id,omitempty"`
	At        time.Time `json:"at"`

	LSN pglogrepl.LSN `json:"-"` // CommitLSN parsed
}

// newKafka creates the stream's transactional producer. Without reports it asks for no
// per-record delivery reports (they cost about a third of the relay's CPU per record): a
// refused record then fails the commit, and the next stream, with reports, finds it.
func newKafka(ctx context.Context, cfg Config, slot, key string, reports bool, batch int, log *zap.Logger) (*kafkaSide, error) {
	kc := kafka.ConfigMap{}
	for k, v := range cfg.Kafka {
		kc[k] = v
	}
	kc["transactional.id"] = cfg.TransactionalIDPrefix + slot
	kc["enable.idempotence"] = true
	kc["acks"] = "all"
	kc["go.delivery.report.fields"] = "none"
	kc["go.delivery.reports"] = reports
	if batch > 0 {
		kc["batch.size"] = batch
	} else {
		batch = defaultBatchSize
	}
	publish.ProducerDefaults(kc) // partitioner=murmur2_random, linger.ms=5 (as the table relay)
	if _, ok := kc["queue.buffering.max.messages"]; !ok {
		kc["queue.buffering.max.messages"] = 200000
	}
	p, err := kafka.NewProducer(&kc)
	if err != nil {
		return nil, fmt.Errorf("walrelay: create producer: %w", err)
	}
	k := &kafkaSide{cfg: cfg, p: p, key: []byte(key), reports: reports, log: log, topics: map[string]int{}, checked: map[string]time.Time{},
		limits: map[string]publish.Limits{}, batch: batch, reach: publish.NewReach(p)}
	k.wg.Add(1)
	go k.drain()
	ictx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	// Fences any earlier producer of this slot (a zombie relay) and aborts its open transaction.
	if err := p.InitTransactions(ictx); err != nil {
		k.close()
		return nil, fmt.Errorf("walrelay: init Kafka transactions (transactional.id %s): %w", kc["transactional.id"], err)
	}
	if err := k.ensureCheckpointTopic(ctx); err != nil {
		k.close()
		return nil, err
	}
	return k, nil
}

// drain reads delivery reports: counts them, keeps the open transaction's first failure.
func (k *kafkaSide) drain() {
	defer k.wg.Done()
	for e := range k.p.Events() {
		switch ev := e.(type) {
		case *kafka.Message:
			if ev.TopicPartition.Error != nil {
				var ke kafka.Error
				if !errors.As(ev.TopicPartition.Error, &ke) {
					ke = kafka.NewError(kafka.ErrUnknown, ev.TopicPartition.Error.Error(), false)
				}
				k.mu.Lock()
				p, ok := ev.Opaque.(*position)
				if ok {
					k.failed = append(k.failed, *p)
				}
				if k.failure == nil {
					f := &deliveryFailure{err: ke}
					if ok {
						f.at = *p
					}
					k.failure = f
				}
				k.mu.Unlock()
			} else if _, ok := ev.Opaque.(*position); ok {
				k.acked.Add(1)
				k.reach.Up()
			}
			k.reported.Add(1)
		case kafka.Error:
			k.reach.Observe(ev)
			if ev.IsFatal() {
				k.fatal.Store(&ev)
				k.log.Error("producer fatal error", zap.Error(ev))
			} else {
				k.log.Debug("producer error", zap.Error(ev))
			}
		}
	}
}

func (k *kafkaSide) close() {
	k.reach.Stop()
	if !publish.CloseBounded(k.p, k.log) {
		return // drain ends when the close does
	}
	k.wg.Wait()
}

// ensureCheckpointTopic creates the checkpoint topic (1 partition, compacted) when missing.
func (k *kafkaSide) ensureCheckpointTopic(ctx context.Context) error {
	t := k.cfg.CheckpointTopic
	md, err := k.p.GetMetadata(&t, false, 10000)
	if err == nil {
		if tm, ok := md.Topics[t]; ok && tm.Error.Code() == kafka.ErrNoError && len(tm.Partitions) > 0 {
			return nil
		}
	}
	a, err := kafka.NewAdminClientFromProducer(k.p)
	if err != nil {
		return fmt.Errorf("walrelay: admin client: %w", err)
	}
	defer a.Close()
	rf := 1
	if md != nil && len(md.Brokers) >= 3 {
		rf = 3
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res, err := a.CreateTopics(cctx, []kafka.TopicSpecification{{Topic: t, NumPartitions: 1, ReplicationFactor: rf,
		Config: map[string]string{"cleanup.policy": "compact", "segment.ms": "3600000"}}})
	if err != nil {
		return fmt.Errorf("walrelay: create checkpoint topic %s: %w", t, err)
	}
	for _, r := range res {
		if r.Error.Code() != kafka.ErrNoError && r.Error.Code() != kafka.ErrTopicAlreadyExists {
			return fmt.Errorf("walrelay: create checkpoint topic %s: %w", t, r.Error)
		}
	}
	return nil
}

// readCheckpoint reads the checkpoint topic (read_committed) to its end and returns the last
// checkpoint of key (LSN 0 when none).
func readCheckpoint(ctx context.Context, cfg Config, key []byte) (checkpoint, error) {
	cc := kafka.ConfigMap{}
	for kk, v := range cfg.Kafka {
		switch kk {
		case "bootstrap.servers", "security.protocol", "sasl.mechanisms", "sasl.mechanism", "sasl.username", "sasl.password",
			"ssl.ca.location", "ssl.certificate.location", "ssl.key.location", "ssl.key.password", "client.id", "logger", "go.logs.channel.enable", "go.logs.channel":
			cc[kk] = v
		}
	}
	cc["group.id"] = "kafkatx-walrelay-checkpoint"
	cc["enable.auto.commit"] = false
	cc["isolation.level"] = "read_committed"
	cc["enable.partition.eof"] = true
	cc["auto.offset.reset"] = "earliest"
	// The reader wants the partition's end, not to wait for more: the broker holds an empty
	// fetch for fetch.wait.max.ms (500 ms by default) before the end shows, on every stream's
	// start — twice for a record the broker refuses (measured: 1.0–1.1 s a read with the
	// default; TestRecordRefusedMidStreamIsParkedAndTheNextPublished).
	cc["fetch.wait.max.ms"] = 10
	c, err := kafka.NewConsumer(&cc)
	if err != nil {
		return checkpoint{}, fmt.Errorf("walrelay: checkpoint reader: %w", err)
	}
	defer c.Close()
	t := cfg.CheckpointTopic
	if err := c.Assign([]kafka.TopicPartition{{Topic: &t, Partition: 0, Offset: kafka.OffsetBeginning}}); err != nil {
		return checkpoint{}, fmt.Errorf("walrelay: read checkpoint topic %s: %w", t, err)
	}
	var last checkpoint
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if ctx.Err() != nil {
			return checkpoint{}, ctx.Err()
		}
		switch ev := c.Poll(200).(type) {
		case *kafka.Message:
			if string(ev.Key) != string(key) {
				continue
			}
			var cp checkpoint
			if err := json.Unmarshal(ev.Value, &cp); err != nil {
				return checkpoint{}, fmt.Errorf("walrelay: checkpoint at offset %d of %s: %w", ev.TopicPartition.Offset, t, err)
			}
			l, err := pglogrepl.ParseLSN(cp.CommitLSN)
			if err != nil {
				return checkpoint{}, fmt.Errorf("walrelay: checkpoint at offset %d of %s: %w", ev.TopicPartition.Offset, t, err)
			}
			cp.LSN = l
			last = cp
		case kafka.PartitionEOF:
			return last, nil
		case kafka.Error:
			if ev.IsFatal() || ev.Code() == kafka.ErrUnknownTopicOrPart {
				return checkpoint{}, fmt.Errorf("walrelay: read checkpoint topic %s: %w", t, ev)
			}
		}
	}
	return checkpoint{}, fmt.Errorf("walrelay: read checkpoint topic %s: no end within 60 s", t)
}

// topicPartitions returns topic's partition count (-1: no such topic), asking the broker at
// most every 30 s for a topic it did not know.
func (k *kafkaSide) topicPartitions(topic string) int {
	if n, ok := k.topics[topic]; ok && (n >= 0 || time.Since(k.checked[topic]) < 30*time.Second) {
		return n
	}
	if kafkaname.Topic(topic) != nil {
		return 0 // never asked: confluent-kafka-go panics on a name over 512 bytes (stream.record parks it)
	}
	n := -1
	md, err := k.p.GetMetadata(&topic, false, 10000)
	if err != nil {
		return 0 // unknown: let the producer decide
	}
	if tm, ok := md.Topics[topic]; ok && tm.Error.Code() == kafka.ErrNoError && len(tm.Partitions) > 0 {
		n = len(tm.Partitions)
	}
	k.topics[topic], k.checked[topic] = n, time.Now()
	return n
}

// waitReported waits up to d until every produced record's delivery was reported.
func (k *kafkaSide) waitReported(d time.Duration) {
	end := time.Now().Add(d)
	for k.reported.Load() < k.produced.Load() && time.Now().Before(end) {
		time.Sleep(time.Millisecond)
	}
}

// takeFailure returns and clears the open transaction's first failed delivery.
func (k *kafkaSide) takeFailure() *deliveryFailure {
	k.mu.Lock()
	defer k.mu.Unlock()
	f := k.failure
	if f != nil {
		f.all = k.failed
	}
	k.failure, k.failed = nil, nil
	return f
}

// refused reports whether the broker refused a record for good or with its batch (publish
// classifies: Park or Isolate), not for a reason a retry of the stream can clear.
func refused(code kafka.ErrorCode) bool {
	c, _ := publish.ClassifyCode(code, false)
	return c != publish.Retry
}

// defaultBatchSize is librdkafka's batch.size default: the most one batch (a partition's
// records in one request) may hold, framing included.
const defaultBatchSize = 1000000

// limits returns topic's limits (publish.ReadLimits, once per stream); zero when they cannot
// be read (then only a refusal tells). The broker applies max.message.bytes to a whole batch.
func (k *kafkaSide) topicLimits(ctx context.Context, topic string) publish.Limits {
	if v, ok := k.limits[topic]; ok {
		return v
	}
	l, err := publish.ReadLimits(ctx, k.p, topic)
	if err != nil {
		l = publish.Limits{}
	}
	k.limits[topic] = l
	return l
}
