package engine

import (
	"errors"
	"sync"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/offsetstore"
)

// committer commits watermarks to Kafka after the database has committed them. Workers
// hand it the newest watermark per partition and go on; it coalesces and commits in the
// background, so a batch never waits for a Kafka round trip. A commit Kafka refuses (a
// rebalance in progress, a coordinator moving, a broker down) stays pending and is tried
// again every retryInterval until it succeeds or the partition leaves this member (drop):
// the database leads, so a lost commit is harmless to the data, but Kafka's offset — what
// lag monitoring reads — must not stay behind a partition this member keeps.
type committer struct {
	kc  *kafka.Consumer
	log *zap.Logger

	mu       sync.Mutex
	pending  map[offsetstore.TP]int64
	lastWarn time.Time // of the last failed-commit warning (one every 10 s at most)
	wake     chan struct{}
	quit     chan struct{}
	// commitMu serializes commit calls, so a revoke's final commit never races an older
	// background commit of the same partition.
	commitMu sync.Mutex
	// commitFn is kc.CommitOffsets (a test replaces it).
	commitFn func([]kafka.TopicPartition) ([]kafka.TopicPartition, error)
	// mark gives the metadata of a commit of a partition in replay epoch epoch (the
	// consumer's offsetstate.CommitMark, rollback.go); nil or returning nil: none.
	mark   func(tp offsetstore.TP, epoch int) *string
	epochs map[offsetstore.TP]int // guarded by mu
	// flushWait bounds how long flush waits for Kafka (half of Config.CloseTimeout; zero: no
	// bound).
	flushWait time.Duration
}

// retryInterval is how often refused commits are tried again.
const retryInterval = time.Second

func newCommitter(kc *kafka.Consumer, log *zap.Logger) *committer {
	c := &committer{kc: kc, log: log, pending: map[offsetstore.TP]int64{}, epochs: map[offsetstore.TP]int{}, wake: make(chan struct{}, 1), quit: make(chan struct{})}
	if kc != nil {
		c.commitFn = kc.CommitOffsets
	}
	return c
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

// setEpoch records the replay epoch of tp for its commits' marks.
func (c *committer) setEpoch(tp offsetstore.TP, epoch int) {
	c.mu.Lock()
	c.epochs[tp] = epoch
	c.mu.Unlock()
}

// reset replaces the pending commit of tp by offset, lower or not: the database's watermark
// went back (a rollback of the database, rollback.go) and Kafka follows it.
func (c *committer) reset(tp offsetstore.TP, offset int64) {
	c.mu.Lock()
	c.pending[tp] = offset
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
		ktp := kafka.TopicPartition{Topic: &topic, Partition: tp.Partition, Offset: kafka.Offset(off)}
		if c.mark != nil {
			ktp.Metadata = c.mark(tp, c.epochs[tp])
		}
		out = append(out, ktp)
		delete(c.pending, tp)
	}
	return out
}

// requeue puts back the offsets of tps that Kafka refused, unless a newer watermark of the
// same partition was enqueued meanwhile.
func (c *committer) requeue(tps []kafka.TopicPartition) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, tp := range tps {
		k := offsetstore.TP{Topic: *tp.Topic, Partition: tp.Partition}
		if cur, ok := c.pending[k]; !ok || int64(tp.Offset) > cur {
			c.pending[k] = int64(tp.Offset)
		}
	}
}

// commit commits tps; the partitions Kafka refused (the whole call failing, or one
// partition's error) are requeued, and the first refusal is returned.
func (c *committer) commit(tps []kafka.TopicPartition) error {
	if len(tps) == 0 {
		return nil
	}
	c.commitMu.Lock()
	res, err := c.commitFn(tps)
	c.commitMu.Unlock()
	failed := tps
	if err == nil {
		failed = nil
		for _, tp := range res {
			if tp.Error != nil {
				failed = append(failed, tp)
				if err == nil {
					err = tp.Error
				}
			}
		}
		// CommitOffsets answers with the offsets committed; requeue what we asked for.
		if len(failed) > 0 {
			asked := map[offsetstore.TP]kafka.TopicPartition{}
			for _, tp := range tps {
				asked[offsetstore.TP{Topic: *tp.Topic, Partition: tp.Partition}] = tp
			}
			for i, tp := range failed {
				failed[i] = asked[offsetstore.TP{Topic: *tp.Topic, Partition: tp.Partition}]
			}
		}
	}
	if err == nil {
		return nil
	}
	c.requeue(failed)
	c.mu.Lock()
	warn := time.Since(c.lastWarn) >= 10*time.Second
	if warn {
		c.lastWarn = time.Now()
	}
	c.mu.Unlock()
	lvl := zap.DebugLevel
	if warn {
		lvl = zap.WarnLevel
	}
	c.log.Check(lvl, "Kafka refused an offset commit; retrying (the database watermark leads, nothing is lost)").
		Write(zap.Int("partitions", len(failed)), zap.Error(err))
	return err
}

// flush commits the pending watermarks of the given partitions (all when nil) now, trying a
// refused commit up to three times over about a second, and waiting at most flushWait for
// Kafka's answers (no bound when zero). A broker frozen mid-request (SIGSTOP, a long pause)
// holds a synchronous commit for as long as it stays frozen, and a client that lost its
// coordinator may never answer it: past flushWait the commit goes on in the background (its
// partitions requeued if it fails) and flush returns errFlushTimeout, so a revocation or a
// shutdown is never held by Kafka. The database watermark leads: a late or lost commit is
// harmless to the data.
func (c *committer) flush(only map[offsetstore.TP]bool) error {
	if c.flushWait <= 0 {
		return c.flushNow(only)
	}
	done := make(chan error, 1)
	go func() { done <- c.flushNow(only) }()
	t := time.NewTimer(c.flushWait)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		c.log.Warn("Kafka did not answer the offset commit in time; going on without it (the database watermark leads, nothing is lost)",
			zap.Duration("waited", c.flushWait))
		return errFlushTimeout
	}
}

// errFlushTimeout is flush's answer when Kafka did not answer within flushWait.
var errFlushTimeout = errors.New("kafkatx: the offset commit was not answered in time")

func (c *committer) flushNow(only map[offsetstore.TP]bool) error {
	var err error
	for try := 0; try < 3; try++ {
		if try > 0 {
			time.Sleep(time.Duration(try) * 300 * time.Millisecond)
		}
		if err = c.commit(c.take(only)); err == nil {
			return nil
		}
	}
	return err
}

// drop forgets pending commits of partitions that left this member (lost, or revoked after
// their final flush): committing them later could move back an offset their new owner
// committed.
func (c *committer) drop(only map[offsetstore.TP]bool) { c.take(only) }

func (c *committer) run() {
	retry := time.NewTicker(retryInterval)
	defer retry.Stop()
	for {
		select {
		case <-c.quit:
			_ = c.flushNow(nil) // client.close bounds the wait (rejoin.go)
			return
		case <-c.wake:
			_ = c.commit(c.take(nil))
		case <-retry.C:
			_ = c.commit(c.take(nil)) // refused commits, requeued
		}
	}
}

func (c *committer) stop() { close(c.quit) }
