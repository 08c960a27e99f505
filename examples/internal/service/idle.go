package service

import (
	"context"
	"fmt"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/catchup"
	"github.com/kafkatx/kafkatx/pg"
)

// "Idle" for --exit-when-idle means caught up, not "nothing arrived": a broker outage also
// stops messages from arriving. So besides the quiet spell (no message for ExitWhenIdle,
// nothing in flight or waiting, the outbox empty), the binary exits only when
//   - the consumer reports no Kafka error (Readiness.KafkaError is empty), and
//   - the broker answers, now, each partition's log end (ListOffsets, read_committed: the last
//     stable offset), and no partition of the topic has a log end ahead of the group's
//     watermark in PostgreSQL (a partition without a watermark row is caught up only while
//     its log is empty).
// Every partition of the topic is checked, not only this member's: a member that exits while
// another still drains would otherwise hand its partitions back mid-drain at the next
// rebalance. When no partition is assigned within NoAssignmentTimeout, Run returns an error
// (exit non-zero) if the consumer cannot reach Kafka, and nil otherwise (every partition is
// held by other members).

// idleCheck asks the broker and the database whether the group has caught up on the topic
// (catchup.Checker).
type idleCheck struct {
	catchUp *catchup.Checker
	pools   []pg.Querier // the database, or every shard
	group   string
	topic   string
}

func newIdleCheck(o Options, kcfg kafka.ConfigMap) (*idleCheck, error) {
	c, err := catchup.New(kcfg, o.Logger, o.Schema)
	if err != nil {
		return nil, err
	}
	pools := []pg.Querier{o.Pool}
	if o.Shards != nil {
		pools = pools[:0]
		for _, sh := range o.Shards.Shards {
			pools = append(pools, sh.Pool)
		}
	}
	return &idleCheck{catchUp: c, pools: pools, group: o.Group, topic: o.Topic}, nil
}

func (c *idleCheck) close() { c.catchUp.Close() }

// caughtUp reports whether every partition of the topic has its watermark at or past its log
// end; why says which is behind, or what could not be asked.
func (c *idleCheck) caughtUp(ctx context.Context) (ok bool, why string) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	behind, err := c.catchUp.BehindOn(ctx, c.pools, c.group, c.topic)
	if err != nil {
		return false, err.Error()
	}
	if len(behind) > 0 {
		return false, fmt.Sprintf("not caught up: %s", behind[0]) + more(len(behind)-1)
	}
	return true, ""
}

func more(n int) string {
	if n <= 0 {
		return ""
	}
	return fmt.Sprintf(" (and %d more partitions)", n)
}

// NoAssignmentError is Run's error when no partition was assigned within
// Options.NoAssignmentTimeout while the consumer could not reach Kafka.
type NoAssignmentError struct {
	Waited     time.Duration
	KafkaError string // Readiness.KafkaError
}

func (e *NoAssignmentError) Error() string {
	return fmt.Sprintf("no partition assigned in %s and Kafka cannot be reached: %s", e.Waited.Round(time.Second), e.KafkaError)
}

// watchIdle cancels the consumer once it is idle as Options.ExitWhenIdle says: quiet for
// ExitWhenIdle, and caught up (idleCheck). It returns a *NoAssignmentError when it gives up
// waiting for an assignment because Kafka cannot be reached, else nil.
func watchIdle(ctx context.Context, cancel context.CancelFunc, o Options, rl inProcessRelay, check *idleCheck) error {
	start := time.Now()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	var lastWhy string
	var nextCheck time.Time
	draining := false // the outbox had rows to publish at the last ask
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		s := o.Consumer.Stats()
		if s.FirstAssignedAt.IsZero() {
			if time.Since(start) > o.NoAssignmentTimeout {
				cancel()
				if rd := o.Consumer.Readiness(context.WithoutCancel(ctx)); rd.KafkaError != "" {
					return &NoAssignmentError{Waited: time.Since(start), KafkaError: rd.KafkaError}
				}
				o.Logger.Warn("no partition assigned; exiting", zap.Duration("waited", time.Since(start)))
				return nil
			}
			continue
		}
		last := s.FirstAssignedAt
		if s.LastMessageAt.After(last) {
			last = s.LastMessageAt
		}
		if s.InFlight > 0 || s.Waiting > 0 || time.Since(last) < o.ExitWhenIdle {
			continue
		}
		// Only now, when otherwise quiet: the outbox empty, Kafka reachable, every partition
		// caught up — asked at most once a second, except that while the relay still drains
		// the outbox its Pending (one query) is asked every tick and the Kafka check follows
		// as soon as it answers no: the exit comes within a tick of the last publication,
		// not up to a second after it.
		if !draining && time.Now().Before(nextCheck) {
			continue
		}
		pending, err := rl.Pending(ctx)
		if draining = err == nil && pending; err != nil || pending {
			if err != nil {
				nextCheck = time.Now().Add(time.Second)
			}
			continue
		}
		nextCheck = time.Now().Add(time.Second)
		why := ""
		if rd := o.Consumer.Readiness(ctx); rd.KafkaError != "" {
			why = "Kafka cannot be reached: " + rd.KafkaError
		} else if check != nil {
			_, why = check.caughtUp(ctx)
		}
		if why != "" {
			if why != lastWhy && ctx.Err() == nil {
				o.Logger.Info("quiet but not idle; not exiting", zap.String("reason", why))
			}
			lastWhy = why
			continue
		}
		if pending, err := rl.Pending(ctx); err != nil || pending {
			continue // written while Kafka was asked: the relay has more to publish
		}
		o.Logger.Info("idle (caught up); exiting", zap.Duration("since_last_message", time.Since(last)))
		cancel()
		return nil
	}
}
