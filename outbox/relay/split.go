package relay

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/outbox"
	"github.com/kafkatx/kafkatx/outbox/internal/publish"
)

// limitTTL is how often a topic's max.message.bytes is asked again, so that a changed
// limit is picked up.
const limitTTL = 10 * time.Minute

// askRetry is how soon an ask the broker did not answer is made again: the topic may not
// exist yet (its rows wait aside until it does) or the broker may be unreachable.
const askRetry = 30 * time.Second

// sizeLimit is what the relay knows of one topic's size limit.
type sizeLimit struct {
	bytes int       // most bytes of the topic's records in flight at once; 0: no budget
	at    time.Time // when it was asked or learned
	asked int       // the topic's max.message.bytes when last asked; 0: not known
	// partitions is the topic's partition count when its budget was set or a refusal was
	// seen (metadata); 0: not known, and the budget is the topic's, not each partition's.
	partitions int
	// compacted: the topic's cleanup.policy includes compact, so the broker refuses records
	// with a nil key (INVALID_RECORD) together with their whole batch; such rows are parked
	// before they are sent (produce).
	compacted bool
}

// sizeLimits keeps, per topic, a byte budget under the topic's max.message.bytes.
//
// librdkafka fills a partition's batch up to batch.size (1,000,000 bytes by default) whatever
// the topic accepts, and a broker refuses a batch over the topic's max.message.bytes whole
// (MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE) without saying which record; the Java producer
// splits such a batch and sends it again (KIP-126), librdkafka does not. So the relay asks each
// topic's max.message.bytes when it first produces to it (DescribeConfigs, again every
// limitTTL), and when it is below what librdkafka may put in one batch it produces that
// topic's records in chunks whose estimated size stays under it, each chunk's delivery
// reports awaited before the next. A refusal all the same (the topic's limit could not be
// read, or was lowered meanwhile) halves the budget (tighten). Before, every refused record
// was sent again alone: a topic with a 16 KiB limit and 260-byte records was published at
// about 170 records a second, and a refused batch split over two requests published later
// rows of a key before the earlier ones. Used by Run's goroutine only.
type sizeLimits map[string]sizeLimit

// of returns topic's budget, when it has one.
func (l sizeLimits) of(topic string) (int, bool) {
	s, ok := l[topic]
	return s.bytes, ok && s.bytes > 0
}

// any reports whether a row of rows has a topic with a budget.
func (l sizeLimits) any(rows []row) bool {
	if len(l) == 0 {
		return false
	}
	for i := range rows {
		if _, ok := l.of(rows[i].topic); ok {
			return true
		}
	}
	return false
}

// batchBytes is the most bytes librdkafka puts in one batch with these producer settings:
// the smaller of batch.size and message.max.bytes, each 1,000,000 unless set.
func batchBytes(cfg kafka.ConfigMap) int {
	setting := func(k string) int {
		if v, ok := cfg[k]; ok {
			if m, err := strconv.Atoi(fmt.Sprint(v)); err == nil && m > 0 {
				return m
			}
		}
		return 1_000_000
	}
	return min(setting("batch.size"), setting("message.max.bytes"))
}

// ask reads the max.message.bytes of every topic of rows not asked within limitTTL and sets
// its budget: none when librdkafka's batches fit (batchBytes), else the limit less
// limitMargin. An unchanged limit over unchanged partitions keeps the budget as refusals left
// it (the size estimate fell short once: it would again); a changed one starts again from the
// limit. A topic whose limit cannot be read keeps what it had (none at first) and is asked
// again after askRetry; a refusal still sets a budget (tighten). It also reads the topic's
// cleanup.policy.
func (r *Relay) ask(ctx context.Context, p *producer, rows []row, now time.Time) {
	var seen map[string]bool
	for i := range rows {
		topic := rows[i].topic
		if s, ok := r.limits[topic]; (ok && now.Sub(s.at) < limitTTL) || seen[topic] || invalidTopic(topic) != nil {
			continue // a name Kafka refuses has no limits: its rows are parked (topics.check)
		}
		if seen == nil {
			seen = map[string]bool{}
		}
		seen[topic] = true
		s := r.limits[topic]
		s.at = now
		var mmb int
		var err error
		if r.testHookMaxMessageBytes != nil {
			mmb, err = r.testHookMaxMessageBytes(topic)
		} else {
			var l publish.Limits
			l, err = publish.ReadLimits(ctx, p.p, topic)
			mmb, s.compacted = l.MaxMessageBytes, l.Compacted
		}
		parts := 0
		if err == nil && (s.bytes > 0 || mmb-limitMargin < r.batchBytes) {
			parts, _ = p.partitionCount(topic) // 0 when unknown: the budget is the topic's
		}
		switch {
		case err != nil:
			r.log.Debug("relay: could not read the topic's max.message.bytes; a batch it refuses as too large sets its chunk size",
				zap.String("topic", topic), zap.Error(err))
			s.at = now.Add(askRetry - limitTTL) // asked again after askRetry
		case mmb == s.asked && parts == s.partitions:
			// Unchanged: keep the budget, lowered by refusals since if it was.
		case mmb-limitMargin >= r.batchBytes:
			s.bytes, s.asked = 0, mmb
		default:
			r.log.Info("relay: the topic's max.message.bytes is below librdkafka's batch size; producing its records in chunks under it",
				zap.String("topic", topic), zap.Int("max_message_bytes", mmb), zap.Int("batch_bytes", r.batchBytes))
			s.bytes, s.asked = max(mmb-limitMargin, 1), mmb
		}
		if err == nil {
			s.partitions = parts
		}
		r.limits[topic] = s
	}
}

// recordSize estimates the bytes of w's record in a Kafka record batch (v2): key, value,
// headers (with the kafkatx-outbox-id header the relay adds) and the varints and attributes
// around them, rounded up. The batch's own header (61 bytes) is in limitMargin.
func recordSize(w *row) int {
	n := len(w.key) + len(w.value) + len(outbox.HeaderOutboxID) + len(w.outboxID) + 48
	for j := range w.hk {
		n += len(w.hk[j]) + len(w.hv[j]) + 10
	}
	return n
}

// limitMargin is kept below a topic's max.message.bytes for the batch header and for
// estimates that fall short.
const limitMargin = 512

// sizeRefusal reports whether err is a broker's refusal of a batch too large for the topic.
func sizeRefusal(err error) bool {
	var ke kafka.Error
	if !errors.As(err, &ke) {
		return false
	}
	return ke.Code() == kafka.ErrMsgSizeTooLarge || ke.Code() == kafka.ErrRecordListTooLarge
}

// tighten sets topic's budget after refused bytes of it were refused as too large: half of
// the smaller of its budget (none: unbounded) and what was refused, at least 1 (a record
// alone) — unless the topic's partition count changed since the budget was set, which is then
// the cause: the budget restarts from the topic's limit over the new count.
func (r *Relay) tighten(p *producer, topic string, refused int, now time.Time) {
	s := r.limits[topic]
	if s.at.IsZero() {
		s.at = now
	}
	parts, _ := p.partitionCount(topic) // 0 when unknown: the budget is the topic's
	if s.bytes > 0 && s.asked > 0 && parts != s.partitions {
		// Partitions were added since the budget was set: records counted on two partitions
		// shared one. Count on the new partitions, from the topic's limit.
		r.log.Info("relay: the topic's partitions changed; producing its records in chunks over the new partitions",
			zap.String("topic", topic), zap.Int("partitions", parts), zap.Int("was", s.partitions))
		s.partitions, s.bytes = parts, max(s.asked-limitMargin, 1)
		r.limits[topic] = s
		return
	}
	s.partitions = parts
	cur := refused
	if s.bytes > 0 {
		cur = min(s.bytes, refused)
	}
	s.bytes = max(cur/2, 1)
	r.limits[topic] = s
	r.log.Info("relay: the broker refused a batch as too large for the topic; producing its records in smaller chunks",
		zap.String("topic", topic), zap.Int("chunk_bytes", s.bytes))
}

// produceChunked produces rows in order in chunks that keep the estimated bytes of each
// partition of a budgeted topic within its budget (rows of other topics join any chunk),
// waiting for a chunk's delivery reports before sending the next. A row that failed blocks
// its key for the later chunks, as one sent alone does. A record over its topic's budget is
// the only record of its partition in its chunk, so a size refusal of it is its own
// (produce): it is parked, and the budget is not halved for it.
func (r *Relay) produceChunked(ctx context.Context, p *producer, rows []row, results []result, blocked map[keyID]bool, topics topicStates) {
	used := map[string]*chunkUse{}
	for start := 0; start < len(rows) && ctx.Err() == nil; {
		clear(used)
		end := start
		for ; end < len(rows); end++ {
			w := &rows[end]
			if k, ok := w.keyID(); ok && blocked[k] {
				continue // not sent: takes no room
			}
			limit, ok := r.limits.of(w.topic)
			if !ok {
				continue
			}
			u := used[w.topic]
			if u == nil {
				u = &chunkUse{byPartition: map[int32]int{}}
				used[w.topic] = u
			}
			part, known := partitionOf(w, r.limits[w.topic].partitions, r.byMurmur2)
			size := recordSize(w)
			if !u.fits(part, known, size, limit) && end > start {
				break
			}
			u.add(part, known, size)
		}
		r.produce(ctx, p, rows[start:end], results[start:end], blocked, topics)
		for i := start; i < end; i++ {
			if o := results[i].outcome; o != outcomeDelivered && o != outcomeNone {
				if k, ok := rows[i].keyID(); ok {
					blocked[k] = true
				}
			}
		}
		start = end
	}
}

// learnLimits tightens the budget of every topic that refused a batch of this round as too
// large (tighten), with the bytes of its refused rows.
func (r *Relay) learnLimits(p *producer, rows []row, results []result) {
	var refused map[string]int
	for i := range results {
		if results[i].outcome == outcomeIsolate && sizeRefusal(results[i].err) {
			if refused == nil {
				refused = map[string]int{}
			}
			refused[rows[i].topic] += recordSize(&rows[i])
		}
	}
	now := time.Now()
	for topic, bytes := range refused {
		r.tighten(p, topic, bytes, now)
	}
}

// chunkUse is what a chunk holds of one budgeted topic: bytes per partition where the
// partition is known before producing (partitionOf), and bytes of records whose partition is
// not, counted against every partition. A batch holds one partition's records, so a chunk
// may hold up to the budget per partition.
type chunkUse struct {
	byPartition map[int32]int
	most        int // the largest of byPartition
	anywhere    int // records of unknown partition
}

// fits reports whether a record of size bytes (on partition part when known) keeps every
// partition of the chunk within limit.
func (u *chunkUse) fits(part int32, known bool, size, limit int) bool {
	if known {
		return u.anywhere+u.byPartition[part]+size <= limit
	}
	return u.anywhere+u.most+size <= limit
}

func (u *chunkUse) add(part int32, known bool, size int) {
	if !known {
		u.anywhere += size
		return
	}
	u.byPartition[part] += size
	u.most = max(u.most, u.byPartition[part])
}
