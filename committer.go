package kafkatx

import (
	"sync"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/offsetstore"
)

// committer commits watermarks to Kafka after the database has committed them. Workers
// hand it the newest watermark per partition and go on; it coalesces and commits in the
// background, so a batch never waits for a Kafka round trip. The database leads: a commit
// lost here is repaired on the next assignment (Kafka behind the watermark).
type committer struct {
	kc  *kafka.Consumer
	log *zap.Logger

	mu      sync.Mutex
	pending map[offsetstore.TP]int64
	wake    chan struct{}
	quit    chan struct{}
	// commitMu serializes commit calls, so a revoke's final commit never races an older
	// background commit of the same partition.
	commitMu sync.Mutex
}

func newCommitter(kc *kafka.Consumer, log *zap.Logger) *committer {
	return &committer{kc: kc, log: log, pending: map[offsetstore.TP]int64{}, wake: make(chan struct{}, 1), quit: make(chan struct{})}
}

// enqueue records that the database watermark of tp is now offset.
func (c *committer) enqueue(tp offsetstore.TP, offset int64) {
	c.mu.Lock()
	if cur, ok := c.pending[tp]; !ok || offset > cur {
		c.pending[tp] = offset
	}
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *committer) take(only map[offsetstore.TP]bool) []kafka.TopicPartition {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []kafka.TopicPartition
	for tp, off := range c.pending {
		if only != nil && !only[tp] {
			continue
		}
		topic := tp.Topic
		out = append(out, kafka.TopicPartition{Topic: &topic, Partition: tp.Partition, Offset: kafka.Offset(off)})
		delete(c.pending, tp)
	}
	return out
}

func (c *committer) commit(tps []kafka.TopicPartition) error {
	if len(tps) == 0 {
		return nil
	}
	c.commitMu.Lock()
	defer c.commitMu.Unlock()
	_, err := c.kc.CommitOffsets(tps)
	if err != nil {
		c.log.Debug("commit offsets to Kafka (the database leads; repaired on next assignment)", zap.Error(err))
	}
	return err
}

// flush commits the pending watermarks of the given partitions (all when nil) now.
func (c *committer) flush(only map[offsetstore.TP]bool) error {
	return c.commit(c.take(only))
}

// drop forgets pending commits of partitions that were lost.
func (c *committer) drop(only map[offsetstore.TP]bool) { c.take(only) }

func (c *committer) run() {
	for {
		select {
		case <-c.quit:
			_ = c.flush(nil)
			return
		case <-c.wake:
			_ = c.flush(nil)
		}
	}
}

func (c *committer) stop() { close(c.quit) }
