package engine

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/offsetstore"
)

// A static member (group.instance.id, KIP-345) that the broker forgets — a broker outage
// longer than session.timeout.ms, a process frozen past it, a coordinator that moved and lost
// the member — is refused with UNKNOWN_MEMBER_ID and then fenced: librdkafka reports
// FENCED_INSTANCE_ID as a fatal error and its client can never rejoin. Run then builds a new
// Kafka client with the same configuration and id and joins again (rejoin); the partitions'
// work was stopped first, and the new client's assignment goes through the normal start
// decision (rebalance.go), so the watermarks keep every effect exact across the rebuild.
//
// A fence also means another live process runs with the same id. The two are told apart by
// what follows the rejoin: a live twin fences the new client again at its next heartbeat after
// its own rebuild, while a broker that forgot this member has nothing to fence it with. So a
// fence within FenceRepeatWindow of the previous rejoin, with Kafka reachable all the while
// (no "all brokers down", no failed metadata request since), ends Run with an error that
// says another live process holds the id. A fence after an outage is always ridden out.

// FenceRepeatWindow is how soon after a rejoin a second fence means another live process
// holds the member's group.instance.id (docs/consumer.md, "Static membership").
const FenceRepeatWindow = 2 * time.Minute

// fencedMember is onKafkaError's answer to FENCED_INSTANCE_ID: Run rejoins (or stops).
type fencedMember struct{ err kafka.Error }

func (f *fencedMember) Error() string { return "fenced static member: " + f.err.Error() }

// client is one Kafka consumer client of Run and what runs with it: the committer and the
// topic probe. Run replaces it when the broker fences the member (rejoin).
type client struct {
	kc         *kafka.Consumer
	stale      atomic.Bool // replaced by a new client: its rebalance events are not the loop's
	commitDone chan struct{}
	probeQuit  chan struct{}
	probeDone  chan struct{}
	watchDone  chan struct{} // the running check of the log's identity (identity.go), quit with probeQuit
}

// openClient creates a Kafka consumer with km, subscribes it to the topics and starts its
// committer and topic probe; the loop's kc and commits become its.
func (l *Loop) openClient(ctx context.Context, km kafka.ConfigMap) (*client, error) {
	kc, err := kafka.NewConsumer(&km)
	if err != nil {
		return nil, fmt.Errorf("kafkatx: create Kafka consumer: %w", err)
	}
	cl := &client{kc: kc, commitDone: make(chan struct{}), probeQuit: make(chan struct{}), probeDone: make(chan struct{}), watchDone: make(chan struct{})}
	l.kc = kc
	l.commits = newCommitter(kc, l.log)
	l.commits.flushWait = l.set.CloseTimeout / 2
	l.commits.mark = l.commitMark // the commit mark that tells a database rollback (rollback.go)
	commits := l.commits
	go func() { defer close(cl.commitDone); commits.run() }()
	err = kc.SubscribeTopics(l.set.Topics, func(c *kafka.Consumer, ev kafka.Event) error {
		if cl.stale.Load() {
			return nil // a replaced client: confluent-kafka-go assigns or unassigns by itself
		}
		return l.rebalance(ctx, ev)
	})
	if err != nil {
		l.commits.stop()
		<-cl.commitDone
		_ = closeWithin(kc, l.set.CloseTimeout)
		return nil, fmt.Errorf("kafkatx: subscribe %v: %w", l.set.Topics, err)
	}
	go func() { defer close(cl.probeDone); l.probeTopics(cl.kc, cl.probeQuit) }()
	go func() { defer close(cl.watchDone); l.watchLogs(cl.kc, cl.probeQuit) }()
	return cl, nil
}

// close stops the client's committer (its last flush) and probe and closes it, waiting at
// most d in all: a broker frozen mid-request (SIGSTOP, a long pause) can hold the committer's
// synchronous offset commit, the probe's metadata request and the log check's admin request
// for as long as it stays frozen, and a client that lost its coordinator may never answer the
// commit. The committer gets half of d; what has not finished by then is left behind (the
// database watermark leads: a lost commit is harmless) and the client is closed in the time
// that remains, past which closeWithin leaves it to the process exit.
func (cl *client) close(l *Loop, d time.Duration) {
	deadline := time.Now().Add(d)
	l.commits.stop()
	if !doneBy(cl.commitDone, time.Now().Add(d/2)) {
		l.log.Warn("the last Kafka offset commit did not return within half of Config.CloseTimeout; closing the client without it "+
			"(the database watermark leads, nothing is lost)", zap.Duration("close_timeout", d))
	}
	close(cl.probeQuit)
	doneBy(cl.probeDone, deadline)
	doneBy(cl.watchDone, deadline)
	if err := closeWithin(cl.kc, max(time.Until(deadline), 0)); err != nil {
		l.log.Warn("close Kafka consumer", zap.Error(err))
	}
}

// doneBy waits for done until deadline and reports whether it was closed.
func doneBy(done <-chan struct{}, deadline time.Time) bool {
	t := time.NewTimer(max(time.Until(deadline), 0))
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		select {
		case <-done:
			return true
		default:
			return false
		}
	}
}

// rejoin answers a fence of the static member: it stops the partitions' work, closes the
// fenced client and opens a new one that joins with the same group.instance.id. It returns
// the new client, or the old one and the error that ends Run when the fence repeats within
// FenceRepeatWindow of the last rejoin with Kafka reachable meanwhile (another live process
// holds the id), or when the new client cannot be made.
func (l *Loop) rejoin(ctx context.Context, km kafka.ConfigMap, cl *client, f *fencedMember) (*client, error) {
	instance, _ := l.set.Kafka.Get("group.instance.id", "")
	var last time.Time
	var outage bool
	l.health.set(func(h *health) { last, outage = h.rejoinedAt, h.outageSinceRejoin })
	if !last.IsZero() && time.Since(last) < FenceRepeatWindow && !outage {
		return cl, fmt.Errorf("kafkatx: fatal Kafka error: %w: another live process holds this member's group.instance.id %q: "+
			"the broker fenced this member again %s after it rejoined with a new Kafka client, with the brokers reachable all the while "+
			"(a second fence within %s of a rejoin); the consumer stops: give every process its own group.instance.id",
			f.err, instance, time.Since(last).Round(time.Second), FenceRepeatWindow)
	}
	since := time.Now()
	l.health.set(func(h *health) {
		h.rejoining, h.rejoiningSince, h.joined = f.err.Error(), since, false
	})
	l.log.Warn("the broker fenced this static member (it forgot the member: an outage or a pause longer than session.timeout.ms, "+
		"or another process with its group.instance.id); stopping the partitions' work and rejoining with a new Kafka client",
		zap.Any("group_instance_id", instance), zap.Error(f.err))
	// The partitions' work stops as on a revocation: in-flight transactions finish (the
	// watermark's compare-and-set fences a new owner's), then the Kafka commits are dropped —
	// this client can commit nothing more, and the new client's assignment starts from the
	// database watermark, re-committing it.
	l.stopAll("rejoining after a fence")
	l.commits.drop(nil)
	cl.stale.Store(true)
	cl.close(l, l.set.CloseTimeout)
	for try := 1; ; try++ {
		ncl, err := l.openClient(ctx, km)
		if err == nil {
			l.health.set(func(h *health) { h.rejoinedAt, h.outageSinceRejoin, h.rejoins = time.Now(), false, h.rejoins+1 })
			l.log.Info("rejoining the group with a new Kafka client", zap.Any("group_instance_id", instance), zap.Int("try", try))
			return ncl, nil
		}
		l.log.Error("rejoin: create the new Kafka client; retrying", zap.Error(err))
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(l.set.Backoff(min(try, 8))):
		}
	}
}

// stopAll stops every worker, their in-flight transactions finishing within the shutdown
// timeout, and forgets the partitions without committing them to Kafka.
func (l *Loop) stopAll(why string) {
	l.mu.Lock()
	ps := make([]*worker, 0, len(l.parts))
	for _, f := range l.parts {
		ps = append(ps, f.w)
	}
	l.parts = map[offsetstore.TP]*fetch{}
	l.mu.Unlock()
	l.stopPartitions(ps, false)
	if len(ps) > 0 {
		l.log.Info("partitions released", zap.Strings("partitions", finalOffsets(ps)), zap.String("why", why))
	}
	l.partitionsRevoked(ps, true)
}
