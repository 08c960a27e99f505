package relay

import (
	"fmt"
	"slices"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kafkatx/kafkatx/internal/kafkaname"
)

// topicRecheck is how often a topic found missing is looked up again.
const topicRecheck = time.Second

// topics remembers which topics exist, so rows for a topic that does not exist wait aside
// (excluded from the reads) instead of holding up a whole round for librdkafka's
// topic.metadata.propagation.max.ms, and are parked once it has been missing for
// Config.UnknownTopicTimeout. Used by Run's goroutine only; reset with each producer.
type topics struct {
	known   map[string]bool
	missing map[string]*missingTopic
}

type missingTopic struct {
	since, checked time.Time
}

func newTopics() *topics {
	return &topics{known: map[string]bool{}, missing: map[string]*missingTopic{}}
}

// exists asks the broker (metadata request for that topic alone) whether topic exists.
// ok is false when the broker could not be asked.
func (p *producer) exists(topic string) (exists, ok bool) {
	n, ok := p.partitionCount(topic)
	return n > 0, ok
}

// partitionCount asks the broker (metadata request for that topic alone) for topic's
// partition count: 0 when the topic does not exist. ok is false when the broker could not
// be asked.
func (p *producer) partitionCount(topic string) (n int, ok bool) {
	if kafkaname.Topic(topic) != nil {
		// librdkafka refuses a name over 512 bytes by panicking in its Go client; the broker
		// refuses any name Kafka's rule refuses. check parks such a topic's rows.
		return 0, false
	}
	md, err := p.p.GetMetadata(&topic, false, 5000)
	if err != nil {
		return 0, false
	}
	tm, found := md.Topics[topic]
	if !found {
		return 0, true
	}
	switch tm.Error.Code() {
	case kafka.ErrNoError:
		return len(tm.Partitions), true
	case kafka.ErrUnknownTopicOrPart, kafka.ErrUnknownTopic:
		return 0, true
	}
	return 0, false
}

// excluded returns the missing topics whose rows the next read skips, re-checking those due,
// sorted (a read ahead is taken only with the same list).
func (ts *topics) excluded(p *producer, timeout time.Duration) []string {
	now := time.Now()
	out := []string{}
	for t, m := range ts.missing {
		if now.Sub(m.checked) >= topicRecheck {
			m.checked = now
			if exists, ok := p.exists(t); ok && exists {
				delete(ts.missing, t)
				ts.known[t] = true
				continue
			}
		}
		if now.Sub(m.since) < timeout {
			out = append(out, t)
		}
	}
	slices.Sort(out)
	return out
}

// vanished asks the broker about topic, whose record librdkafka refused as of an unknown
// topic or partition (a metadata request for it alone). gone: the topic does not exist, and
// it is missing from now on, as a topic never seen — its rows wait aside, re-checked every
// second, and are parked after Config.UnknownTopicTimeout, one a key — instead of each record
// parked with the refusal. exists: the broker has it (librdkafka's view lagged). Neither: the
// broker could not be asked.
func (ts *topics) vanished(p *producer, topic string) (gone, exists bool) {
	n, ok := p.partitionCount(topic)
	if !ok || n > 0 {
		return false, ok
	}
	delete(ts.known, topic)
	if ts.missing[topic] == nil {
		now := time.Now()
		ts.missing[topic] = &missingTopic{since: now, checked: now}
	}
	return true, false
}

// check classifies topic for this round: "" to produce its rows; otherwise it is missing and
// wait (rows stay pending) or park (the returned error) applies. A name Kafka refuses
// (kafkaname.Topic) is parked at once, before anything is handed to librdkafka.
func (ts *topics) check(p *producer, topic string, timeout time.Duration) (wait bool, park error) {
	if ts.known[topic] {
		return false, nil
	}
	if err := invalidTopic(topic); err != nil {
		return false, err
	}
	m := ts.missing[topic]
	if m == nil {
		exists, ok := p.exists(topic)
		if !ok {
			return false, nil // cannot tell: let librdkafka decide
		}
		if exists {
			ts.known[topic] = true
			return false, nil
		}
		now := time.Now()
		m = &missingTopic{since: now, checked: now}
		ts.missing[topic] = m
	}
	if d := time.Since(m.since); d >= timeout {
		// A park is asked of the broker first, whenever the last answer was: the topic may
		// have been created a moment ago and the row released (a fresh-eyes attack: released
		// 3 ms after kafka-topics --create, a row was parked again on the answer of up to a
		// second before). One metadata request a round that has such rows to park; most of
		// them are parked by it, and the rows behind them are not read again.
		m.checked = time.Now()
		if exists, ok := p.exists(topic); ok && exists {
			delete(ts.missing, topic)
			ts.known[topic] = true
			return false, nil
		}
		return false, kafka.NewError(kafka.ErrUnknownTopic, fmt.Sprintf("topic %s does not exist (missing for %s)", topic, d.Round(time.Second)), false)
	}
	return true, nil
}

// invalidTopic returns the park error of a row whose topic Kafka refuses as a name
// (kafkaname.Topic: 1 to 249 characters of [a-zA-Z0-9._-], not "." or ".."), nil for a valid
// name. Such a row is parked before anything is handed to librdkafka, whose Go client panics
// on a name over 512 bytes (confluent-kafka-go's topic lookup) and whose broker refuses the
// others.
func invalidTopic(topic string) error {
	if err := kafkaname.Topic(topic); err != nil {
		return kafka.NewError(kafka.ErrTopicException, "the topic name is "+err.Error(), false)
	}
	return nil
}
