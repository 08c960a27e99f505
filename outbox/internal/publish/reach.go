package publish

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// ProbeEvery is how often a Reach whose brokers are all reported down asks one for metadata
// (ProbeEvery at most each) to learn that they answer again.
const ProbeEvery = 2 * time.Second

// Reach tracks whether a relay's producer can reach Kafka, for the relay's Ready: an idle
// relay (an empty outbox, a quiet slot) has no failing publish to show that nothing written
// now could be published. librdkafka reports every broker down (ErrAllBrokersDown) and says
// nothing when one answers again, so while they are reported down Reach asks for metadata
// every ProbeEvery; an answer or a delivered record (Up) clears it. Safe from any goroutine.
type Reach struct {
	p    metadataGetter
	down atomic.Int64 // unix nanoseconds of the first report since the last answer; 0: none
	// awaiting: unix nanoseconds since when the relay waits for an answer (delivery reports,
	// a transaction's commit) with none arriving; 0 when it does not wait (Await).
	awaiting atomic.Int64
	msg      atomic.Pointer[string]
	quit     chan struct{}
	wg       sync.WaitGroup
	once     sync.Once
}

type metadataGetter interface {
	GetMetadata(topic *string, allTopics bool, timeoutMs int) (*kafka.Metadata, error)
}

// NewReach starts tracking p; Stop it before p is closed.
func NewReach(p *kafka.Producer) *Reach {
	r := &Reach{p: p, quit: make(chan struct{})}
	r.wg.Add(1)
	go r.probe()
	return r
}

// Observe takes one of the producer's client-level errors (its Events channel): every broker
// down starts (or keeps) the outage; other errors change nothing.
func (r *Reach) Observe(e kafka.Error) {
	if e.Code() != kafka.ErrAllBrokersDown {
		return
	}
	// The outage's first message: librdkafka repeats the event with counts that change while
	// it reconnects ("2/2 brokers are down", then "0/2 …").
	if r.down.CompareAndSwap(0, time.Now().UnixNano()) {
		msg := e.Error()
		r.msg.Store(&msg)
	}
}

// Up records that a broker answered (a delivery report, a committed transaction): the
// outage, if any, is over and a wait's clock starts again.
func (r *Reach) Up() {
	r.down.Store(0)
	// Only a wait still in progress (a report may come from another goroutine as the wait
	// ends: a plain store would leave a finished wait's clock running).
	if w := r.awaiting.Load(); w != 0 {
		r.awaiting.CompareAndSwap(w, time.Now().UnixNano())
	}
}

// Await records that the relay waits for Kafka's answer from now until the returned func is
// called; NotReady reports a wait in which nothing answered (Up) for its after. A broker that
// is frozen or cut off keeps its connections open, so librdkafka reports no broker down for
// as long as its request timeouts: the unanswered wait is what shows it (a second fresh-eyes
// attack: a WAL relay's /readyz answered 200 through a 40 s broker freeze). One waiter at a
// time (the relay's publishing goroutine).
func (r *Reach) Await() (done func()) {
	r.awaiting.Store(time.Now().UnixNano())
	return func() { r.awaiting.Store(0) }
}

// NotReady returns nil unless a wait (Await) has had no answer for at least after ("Kafka has
// not answered since T …"), or every broker has been reported down for at least after with no
// answer since ("Kafka unreachable since T: librdkafka's message").
func (r *Reach) NotReady(after time.Duration) error {
	if w := r.awaiting.Load(); w != 0 && time.Since(time.Unix(0, w)) >= after {
		return fmt.Errorf("Kafka has not answered since %s (delivery reports or a transaction's commit awaited)", time.Unix(0, w).UTC().Format(time.RFC3339))
	}
	n := r.down.Load()
	if n == 0 || time.Since(time.Unix(0, n)) < after {
		return nil
	}
	msg := ""
	if m := r.msg.Load(); m != nil {
		msg = *m
	}
	return fmt.Errorf("Kafka unreachable since %s: %s", time.Unix(0, n).UTC().Format(time.RFC3339), msg)
}

// Stop ends the probe (a probe in flight ends within ProbeEvery).
func (r *Reach) Stop() {
	r.once.Do(func() { close(r.quit); r.wg.Wait() })
}

func (r *Reach) probe() {
	defer r.wg.Done()
	t := time.NewTicker(ProbeEvery)
	defer t.Stop()
	for {
		select {
		case <-r.quit:
			return
		case <-t.C:
		}
		if r.down.Load() == 0 {
			continue
		}
		if _, err := r.p.GetMetadata(nil, false, int(ProbeEvery.Milliseconds())); err == nil {
			r.Up()
		}
	}
}
