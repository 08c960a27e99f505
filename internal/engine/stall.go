package engine

import (
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/offsetstore"
)

// The stall watchdog. A partition can stop moving for a cause no other check names: a fetch
// left paused in the Kafka client after a lost assignment, a worker that waits on something
// the loop does not see, a bug. So, whatever the cause, a partition this member holds that has
// lag (the log end past its watermark) and whose watermark has not moved for
// Settings.StallAfter is reported: logged once at error level with its watermark, log end
// and how long, kafkatx_partition_stalled is 1 (the emitter), Snapshot.Stalled lists it (not
// ready) — until the watermark moves. When reported, the partition's fetch is also resumed in
// the Kafka client unless the loop itself paused it (its buffer share is full): a resume of a
// partition that is not paused does nothing, and one left paused by the client starts
// fetching again.

// stall is the watchdog's view of one assigned partition, written by the poll loop under
// Loop.mu (Snapshot reads it).
type stall struct {
	watermark int64     // the watermark last seen
	movedAt   time.Time // when it last moved (or the partition was assigned)
	since     int64     // unix nanos the partition was reported stalled; 0 when not
	logEnd    int64     // the log end when reported
}

// Stalled is a partition with lag whose watermark has not moved since Since.
type Stalled struct {
	TP        offsetstore.TP
	Watermark int64
	LogEnd    int64
	Since     time.Time // the watermark's last move
}

// checkStalled runs the watchdog once for partition tp, whose log end is high (< 0: not
// known). The poll loop calls it about once a second.
func (l *Loop) checkStalled(tp offsetstore.TP, f *fetch, high int64) {
	if l.set.StallAfter <= 0 {
		return
	}
	l.mu.Lock() // Snapshot reads the stall state
	defer l.mu.Unlock()
	now := time.Now()
	s := &f.stall
	wm := f.w.watermark.Load()
	if s.movedAt.IsZero() || wm != s.watermark || high >= 0 && high <= wm {
		s.watermark, s.movedAt = wm, now
		if since := s.since; since != 0 {
			s.since = 0
			l.log.Info("partition makes progress again", zap.String("topic", tp.Topic), zap.Int32("partition", tp.Partition),
				zap.Int64("watermark", wm), zap.Duration("stalled", now.Sub(time.Unix(0, since))))
			l.emit.PartitionStalled(tp, wm, high, false)
		}
		return
	}
	if s.since != 0 || high < 0 || now.Sub(s.movedAt) < l.set.StallAfter {
		return
	}
	s.since, s.logEnd = s.movedAt.UnixNano(), high
	fields := []zap.Field{zap.String("topic", tp.Topic), zap.Int32("partition", tp.Partition), zap.Int64("watermark", wm),
		zap.Int64("log_end", high), zap.Duration("for", now.Sub(s.movedAt)), zap.Duration("bound", l.set.StallAfter),
		zap.Bool("paused_for_buffer", f.paused), zap.Int("queued", f.inFlight())}
	if !f.paused {
		if err := l.kc.Resume([]kafka.TopicPartition{f.w.ktp()}); err != nil {
			fields = append(fields, zap.NamedError("resume", err))
		}
	}
	l.log.Error("partition with lag makes no progress: its watermark has not moved (Config.StallAfter); its fetch was resumed unless the loop holds it",
		fields...)
	l.emit.PartitionStalled(tp, wm, high, true)
}

// stalledNow lists the partitions reported stalled (under l.mu).
func (l *Loop) stalledNow() []Stalled {
	var out []Stalled
	for tp, f := range l.parts {
		if n := f.stall.since; n != 0 {
			out = append(out, Stalled{TP: tp, Watermark: f.stall.watermark, LogEnd: f.stall.logEnd, Since: time.Unix(0, n)})
		}
	}
	return out
}

// resumeAssigned resumes the fetch of newly assigned partitions in the Kafka client: a
// partition the loop paused (its buffer share full) and then lost or gave up keeps librdkafka's
// pause across the unassign, and its next assignment would fetch nothing.
func (l *Loop) resumeAssigned(tps []kafka.TopicPartition) {
	if len(tps) == 0 {
		return
	}
	if err := l.kc.Resume(tps); err != nil {
		l.log.Debug("resume assigned partitions", zap.Error(err))
	}
}
