package publish

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// answers is a metadata source that answers once ok is set.
type answers struct{ ok atomic.Bool }

func (a *answers) GetMetadata(*string, bool, int) (*kafka.Metadata, error) {
	if a.ok.Load() {
		return &kafka.Metadata{}, nil
	}
	return nil, errors.New("Local: Broker transport failure")
}

func TestReachReportsBrokersDownUntilOneAnswers(t *testing.T) {
	src := &answers{}
	r := &Reach{p: src, quit: make(chan struct{})}
	r.wg.Add(1)
	go r.probe()
	defer r.Stop()
	if err := r.NotReady(0); err != nil {
		t.Fatalf("NotReady before any report: %v", err)
	}
	r.Observe(kafka.NewError(kafka.ErrTransport, "broker transport failure", false)) // not an outage
	if err := r.NotReady(0); err != nil {
		t.Fatalf("NotReady after a transport error of one broker: %v", err)
	}
	r.Observe(kafka.NewError(kafka.ErrAllBrokersDown, "1/1 brokers are down", false))
	if err := r.NotReady(time.Hour); err != nil {
		t.Fatalf("NotReady(1h) at once: %v", err)
	}
	err := r.NotReady(0)
	if err == nil || !strings.Contains(err.Error(), "Kafka unreachable since") || !strings.Contains(err.Error(), "1/1 brokers are down") {
		t.Fatalf("NotReady(0) while down: %v", err)
	}
	time.Sleep(ProbeEvery + 500*time.Millisecond) // a probe that gets no answer keeps it
	if r.NotReady(0) == nil {
		t.Fatal("cleared without an answer")
	}
	src.ok.Store(true)
	deadline := time.Now().Add(30 * ProbeEvery) // a ceiling: the next probe clears it
	for r.NotReady(0) != nil {
		if time.Now().After(deadline) {
			t.Fatal("still down after a broker answered the probe")
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.Observe(kafka.NewError(kafka.ErrAllBrokersDown, "1/1 brokers are down", false))
	r.Up() // a delivery report
	if err := r.NotReady(0); err != nil {
		t.Fatalf("NotReady after a delivery: %v", err)
	}
}

// A wait with no answer (a frozen broker keeps its connections: librdkafka reports nothing
// down for as long as its request timeouts) is reported after its after; an answer restarts
// the clock, the end of the wait clears it.
func TestReachReportsAWaitWithNoAnswer(t *testing.T) {
	r := &Reach{p: &answers{}, quit: make(chan struct{})}
	done := r.Await()
	time.Sleep(30 * time.Millisecond)
	err := r.NotReady(20 * time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "Kafka has not answered since") {
		t.Fatalf("NotReady after an unanswered wait: %v", err)
	}
	r.Up() // a delivery report
	if err := r.NotReady(20 * time.Millisecond); err != nil {
		t.Fatalf("NotReady right after an answer: %v", err)
	}
	time.Sleep(30 * time.Millisecond)
	if r.NotReady(20*time.Millisecond) == nil {
		t.Fatal("the clock did not run again after the answer")
	}
	done()
	if err := r.NotReady(20 * time.Millisecond); err != nil {
		t.Fatalf("NotReady after the wait ended: %v", err)
	}
}
