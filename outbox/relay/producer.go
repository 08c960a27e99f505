package relay

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/outbox/internal/publish"
)

// producer is the leader's idempotent producer, the goroutine that drains its events, and
// whether its brokers answer (reach: the relay's Ready).
type producer struct {
	p     *kafka.Producer
	fatal atomic.Bool
	reach *publish.Reach
	log   *zap.Logger
	wg    sync.WaitGroup
	once  sync.Once
}

func newProducer(cfg kafka.ConfigMap, log *zap.Logger) (*producer, error) {
	kp, err := kafka.NewProducer(&cfg)
	if err != nil {
		// librdkafka's message names the setting, never its value.
		return nil, fmt.Errorf("relay: create producer: %w", err)
	}
	p := &producer{p: kp, reach: publish.NewReach(kp), log: log}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		// Delivery reports go to per-round channels; this sees client-level events only.
		var quiet errorLimiter
		for e := range kp.Events() {
			switch ev := e.(type) {
			case kafka.Error:
				p.reach.Observe(ev)
				if ev.IsFatal() {
					p.fatal.Store(true)
					log.Error("producer fatal error", zap.Error(ev))
				} else if ok, suppressed := quiet.allow(ev.Code(), time.Now()); ok {
					log.Warn("producer error", zap.Error(ev), zap.Int("same_errors_suppressed", suppressed))
				}
			case *kafka.Message:
				// Not expected: every Produce call names a delivery channel.
			}
		}
	}()
	return p, nil
}

// close waits briefly for anything still queued, then closes the producer (its Events channel
// closes, ending the drain goroutine).
func (p *producer) close() {
	p.once.Do(func() {
		p.reach.Stop()
		if p.p.Len() > 0 {
			p.p.Flush(1000)
		}
		if !publish.CloseBounded(p.p, p.log) {
			return // its events goroutine ends when the close does
		}
		p.wg.Wait()
	})
}

// errorRepeat is how often the relay logs one kind of client-level producer error, at most:
// with the brokers down librdkafka reports one at every reconnect attempt (a fresh-eyes
// attack counted 606 warnings in 30 s).
const errorRepeat = 30 * time.Second

// errorLimiter lets one producer error of a code through every errorRepeat and counts the
// ones it holds back in between. Used by one goroutine.
type errorLimiter struct {
	last       map[kafka.ErrorCode]time.Time
	suppressed map[kafka.ErrorCode]int
}

// allow reports whether an error of code at now is logged, and how many of that code were
// held back since the last one logged.
func (l *errorLimiter) allow(code kafka.ErrorCode, now time.Time) (bool, int) {
	if l.last == nil {
		l.last, l.suppressed = map[kafka.ErrorCode]time.Time{}, map[kafka.ErrorCode]int{}
	}
	if at, ok := l.last[code]; ok && now.Sub(at) < errorRepeat {
		l.suppressed[code]++
		return false, 0
	}
	n := l.suppressed[code]
	l.last[code], l.suppressed[code] = now, 0
	return true, n
}
