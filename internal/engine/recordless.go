package engine

import (
	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/offsetstore"
)

// Offsets that hold no record for the application: the commit and abort markers of
// transactional producers (control records), records of aborted transactions under
// isolation.level=read_committed, and offsets a compacted topic no longer holds. A batch that
// follows them moves the watermark over them with its own advance; but the marker that ends
// the last transaction of a partition is followed by nothing, and a watermark left at
// "last record + 1" stays one short of the log end for ever, with Kafka's committed offset
// beside it (librdkafka #3917: a lag of 1 that never drains).
//
// librdkafka's position (rd_kafka_position, the offset of the next record it will hand to
// the application) moves past such offsets in the order of its fetch queue: it is at most
// one past the last record Poll returned, until the offsets after that record are known to
// hold nothing deliverable (measured with librdkafka 2.11: after the last record of a
// committed transaction at offset 9, the position is 10; once Poll has gone past the commit
// marker at 10 and found nothing, 11 = the log end). A seek leaves it unset until the first
// fetch from the new offset. So when a partition is idle — every record dispatched to its
// worker is committed, nothing is kept in memory, the worker holds nothing — the offsets
// between the watermark and the position were read by librdkafka and none was a record: the
// worker advances the watermark to the position, in a transaction of its own, and commits it
// to Kafka. The watermark still never claims an offset that was not read (docs/design.md,
// invariants 1 and 2): it only passes offsets the client has already passed without
// delivering anything.

// recordless asks a partition's worker to move its watermark from From to To: the offsets in
// between were passed by the client without a record.
// With reread, the database's watermark was seen below from (rollback.go): the worker re-reads
// it and seeks back (refence), unless its watermark moved since.
type recordless struct {
	from, to int64
	reread   bool
}

// passRecordless runs on the poll loop's goroutine (the only one that calls Poll, dispatches
// and seeks, so no record can be in between): for each idle partition whose client position
// is past its watermark, it asks the worker to follow the position.
func (l *Loop) passRecordless() {
	var idle []*worker
	var tps []kafka.TopicPartition
	for _, f := range l.parts {
		p := f.w
		if f.paused || len(f.pending) > 0 || p.stopping() || f.inFlight() > 0 || p.dispatchedEnd.Load() != p.watermark.Load() {
			continue
		}
		idle = append(idle, p)
		tps = append(tps, p.ktp())
	}
	if len(tps) == 0 {
		return
	}
	pos, err := l.kc.Position(tps)
	if err != nil {
		l.log.Debug("read fetch positions", zap.Error(err))
		return
	}
	at := make(map[offsetstore.TP]int64, len(pos))
	for _, tp := range pos {
		if tp.Topic != nil && tp.Error == nil && tp.Offset >= 0 {
			at[offsetstore.TP{Topic: *tp.Topic, Partition: tp.Partition}] = int64(tp.Offset)
		}
	}
	for _, p := range idle {
		w := p.watermark.Load()
		to, ok := at[p.tp]
		if !ok || to <= w || p.dispatchedEnd.Load() != w {
			continue
		}
		select {
		case p.skips <- recordless{from: w, to: to}:
		default: // one is pending already; the next tick asks again
		}
	}
}

// passRecordless moves the watermark over offsets the client passed without a record (see
// above) in a transaction of its own (advanceAlone, which audits retention overtaking the
// watermark meanwhile as any batch does), unless the watermark moved since the poll loop
// asked. Errors are those of untilDone: errStopped, offsetstore.ErrFenced, or the loop's
// unexpected errors.
func (p *worker) passRecordless(s recordless) error {
	if s.reread {
		if p.watermark.Load() != s.from {
			return nil
		}
		return offsetstore.ErrFenced
	}
	if p.watermark.Load() != s.from || s.to <= s.from {
		return nil
	}
	if err := p.advanceAlone(advance{to: s.to, read: s.to, inflightEnd: p.inflightEnd}); err != nil {
		return err
	}
	p.log.Debug("watermark moved over offsets without a record (transaction markers, aborted or compacted records)",
		zap.Int64("from", s.from), zap.Int64("to", s.to))
	return nil
}
