// Package topics creates Kafka topics with the AdminClient, treating "already exists" as
// success, for the example binaries and the tests.
package topics

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/cmd/kafkalog"
)

// Ensure creates each named topic with partitions partitions and the given replication
// factor unless it exists. extra, when not nil, sets topic configs (for example
// message.timestamp.type). It waits up to timeout. With a non-nil log, the client's
// librdkafka lines go through it (kafkalog.Route) instead of raw text on stderr; kafkaConfig
// itself is not changed. Errors name the bootstrap servers they tried.
func Ensure(ctx context.Context, log *zap.Logger, kafkaConfig kafka.ConfigMap, names []string, partitions, replication int, extra map[string]string, timeout time.Duration) error {
	admin, p, err := kafkalog.NewAdminClient(log, kafkaConfig)
	if err != nil {
		return fmt.Errorf("create admin client: %w", err)
	}
	defer p.Close()
	defer admin.Close()
	specs := make([]kafka.TopicSpecification, 0, len(names))
	for _, n := range names {
		specs = append(specs, kafka.TopicSpecification{Topic: n, NumPartitions: partitions, ReplicationFactor: replication, Config: extra})
	}
	// The client's errors come as events of its producer: keep the last authentication
	// failure, so that a wrong password or certificate is named instead of a deadline.
	var authErr atomic.Pointer[kafka.Error]
	go func() {
		for ev := range p.Events() { // closed by p.Close
			if e, ok := ev.(kafka.Error); ok && authFailure(e.Code()) {
				authErr.Store(&e)
			}
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	res, err := admin.CreateTopics(ctx, specs, kafka.SetAdminOperationTimeout(timeout))
	if err != nil {
		if e := authErr.Load(); e != nil {
			return fmt.Errorf("create topics %v on the Kafka cluster at %v: authentication failed (check the SASL or TLS settings): %v", names, kafkaConfig["bootstrap.servers"], *e)
		}
		return fmt.Errorf("create topics %v on the Kafka cluster at %v (is it reachable?): %w", names, kafkaConfig["bootstrap.servers"], err)
	}
	for _, r := range res {
		if r.Error.Code() != kafka.ErrNoError && r.Error.Code() != kafka.ErrTopicAlreadyExists {
			return fmt.Errorf("create topic %s: %w", r.Topic, r.Error)
		}
	}
	return nil
}

// authFailure reports whether code is an authentication failure: SASL (a wrong mechanism,
// user or password) or TLS (a certificate the client or the broker refuses).
func authFailure(code kafka.ErrorCode) bool {
	switch code {
	case kafka.ErrAuthentication, kafka.ErrSaslAuthenticationFailed, kafka.ErrSsl:
		return true
	}
	return false
}
