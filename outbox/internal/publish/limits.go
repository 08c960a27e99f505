package publish

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// ErrNilKeyOnCompactedTopic is why a record with a nil key for a topic whose cleanup.policy
// includes compact is parked before it is sent, in either mode: the broker refuses such a
// record (INVALID_RECORD) with the whole batch it travels in, which in table mode sent every
// row of the batch again alone and could publish later rows of a key before earlier ones
// (20,000 rows with 5 nil keys: 10,691–11,423 records produced alone, 4,438 per-key order
// breaks logged), and in WAL mode aborted the Kafka transaction.
var ErrNilKeyOnCompactedTopic = errors.New("a record with a nil key is refused by a compacted topic (cleanup.policy=compact); parked before sending")

// Limits is what a topic accepts, as its effective configuration says (the topic's own or
// the broker's default).
type Limits struct {
	// MaxMessageBytes is the topic's max.message.bytes: the most bytes of one batch (the
	// broker applies it to a whole batch, framing included). 0 when unknown.
	MaxMessageBytes int
	// Compacted: the topic's cleanup.policy includes compact, so a record needs a key.
	Compacted bool
}

// ReadLimits asks the broker (DescribeConfigs through p's connection, within 5 s) for
// topic's Limits.
func ReadLimits(ctx context.Context, p *kafka.Producer, topic string) (Limits, error) {
	a, err := kafka.NewAdminClientFromProducer(p)
	if err != nil {
		return Limits{}, err
	}
	defer a.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	res, err := a.DescribeConfigs(ctx, []kafka.ConfigResource{{Type: kafka.ResourceTopic, Name: topic}})
	if err != nil {
		return Limits{}, err
	}
	if len(res) != 1 {
		return Limits{}, fmt.Errorf("describe topic configuration: %d results", len(res))
	}
	if res[0].Error.Code() != kafka.ErrNoError {
		return Limits{}, res[0].Error
	}
	e, ok := res[0].Config["max.message.bytes"]
	if !ok {
		return Limits{}, errors.New("describe topic configuration: no max.message.bytes")
	}
	mmb, err := strconv.Atoi(e.Value)
	if err != nil {
		return Limits{}, fmt.Errorf("describe topic configuration: max.message.bytes: %w", err)
	}
	return Limits{MaxMessageBytes: mmb, Compacted: strings.Contains(res[0].Config["cleanup.policy"].Value, "compact")}, nil
}

// RefusesNilKey returns ErrNilKeyOnCompactedTopic when a record with key would be refused by
// a topic of these limits for having no key, else nil.
func (l Limits) RefusesNilKey(key []byte) error {
	if key == nil && l.Compacted {
		return ErrNilKeyOnCompactedTopic
	}
	return nil
}
