// Package kafkalog routes librdkafka's log lines into zap, structured (facility, syslog
// level, client name), instead of raw text on stderr: the kafkatx command's and the
// examples' Kafka clients, as the library routes its own (internal/kafkalog holds the rules;
// this package exposes them). A package of the command's module
// (github.com/kafkatx/kafkatx/cmd), not of the library: public so that a copy of an example
// builds outside this repository.
package kafkalog

import (
	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"

	lib "github.com/kafkatx/kafkatx/internal/kafkalog"
)

// Route makes the librdkafka client configured by cfg write its log lines to log, named
// "librdkafka", with their facility and syslog level (client-telemetry chatter at debug),
// instead of raw text on stderr. It sets go.logs.channel.enable and go.logs.channel unless
// cfg sets them, and returns cfg. Every client of the process shares one channel, read by
// one goroutine that lives as long as the process.
func Route(log *zap.Logger, cfg kafka.ConfigMap) kafka.ConfigMap { return lib.Route(log, cfg) }

// NewAdminClient creates an AdminClient with cfg (copied, not changed) on a producer handle,
// so that with a non-nil log the client's librdkafka lines go through Route
// (kafka.NewAdminClient takes no log channel). The producer's Go channels are small: read its
// Events until Close closes them, or a long broker outage fills them and parks the handle's
// poller (the library's kafkalog.NewAdminClient). Close the admin client, then the producer.
func NewAdminClient(log *zap.Logger, cfg kafka.ConfigMap) (*kafka.AdminClient, *kafka.Producer, error) {
	return lib.NewAdminClient(log, cfg)
}
