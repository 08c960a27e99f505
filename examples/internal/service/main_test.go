package service

import (
	"os"
	"testing"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/cmd/kafkalog"
)

// TestMain binds the process's one route of librdkafka's log lines (kafkalog.Route: the
// first caller's logger, for the life of the process, as a binary has one logger) to a logger
// of the test binary's own before any test runs. Bound to the first test's zaptest logger, the
// lines of a later test's Kafka clients reached a test that had ended: a data race the race
// detector reported (CI). The tests assert on the service's own log and readiness, not on
// librdkafka's lines, which are dropped here.
func TestMain(m *testing.M) {
	kafkalog.Route(zap.NewNop(), kafka.ConfigMap{})
	os.Exit(m.Run())
}
