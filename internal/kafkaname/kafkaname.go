// Package kafkaname holds Kafka's rule for topic names, the one rule kafkatx applies wherever
// a topic name is handed to the Kafka client: the relays before they produce or ask for a
// topic's metadata (a name librdkafka refuses, longer than 512 bytes, made its Go client
// panic), and the command-line flags that name a topic to publish to or read from.
package kafkaname

import (
	"errors"
	"fmt"
)

// MaxTopicLength is Kafka's longest topic name, in characters (Kafka's Topic.validate).
const MaxTopicLength = 249

// ErrInvalidTopic is the error Topic's refusals wrap.
var ErrInvalidTopic = errors.New("not a valid Kafka topic name")

// ErrTopicTooLong is Topic's refusal of a name of valid characters longer than
// MaxTopicLength; it wraps ErrInvalidTopic.
var ErrTopicTooLong = fmt.Errorf("%w: longer than %d characters", ErrInvalidTopic, MaxTopicLength)

// Topic returns nil when topic is a name Kafka accepts: 1 to MaxTopicLength characters of
// [a-zA-Z0-9._-], not "." or ".." (Kafka's Topic.validate). Otherwise it returns an error
// wrapping ErrInvalidTopic that says which part of the rule the name breaks, without the name
// itself (it may be long; the caller names it as it sees fit), such as
// "not a valid Kafka topic name: longer than 249 characters (513)".
func Topic(topic string) error {
	switch {
	case topic == "":
		return fmt.Errorf("%w: empty", ErrInvalidTopic)
	case topic == "." || topic == "..":
		return fmt.Errorf("%w: Kafka refuses . and .. as topic names", ErrInvalidTopic)
	}
	for i := 0; i < len(topic); i++ {
		if c := topic[i]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("%w: Kafka topic names hold only ASCII letters, digits, '.', '_' and '-'", ErrInvalidTopic)
		}
	}
	if len(topic) > MaxTopicLength { // ASCII by now: bytes are characters
		return fmt.Errorf("%w (%d)", ErrTopicTooLong, len(topic))
	}
	return nil
}

// Reason is Topic's refusal without the ErrInvalidTopic prefix ("empty", "longer than 249
// characters (513)", ...), for a message that says "not a valid Kafka topic
// name" its own way; "" when topic is valid.
func Reason(topic string) string {
	err := Topic(topic)
	if err == nil {
		return ""
	}
	s := err.Error()
	return s[len(ErrInvalidTopic.Error())+2:]
}
