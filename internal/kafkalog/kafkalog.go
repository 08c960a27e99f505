// Package kafkalog routes librdkafka's log lines into zap, structured (facility, syslog
// level, client name), instead of raw text on stderr: the rules for the library's clients (the
// engine's, internal/offsets') and, through the command module's package of the same name
// (github.com/kafkatx/kafkatx/cmd/kafkalog), for the kafkatx command's and the examples'.
package kafkalog

import (
	"strings"
	"sync"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/kafkatx/kafkatx/internal/kafkaprops"
)

var (
	kafkaLogsOnce sync.Once
	kafkaLogs     chan kafka.LogEvent
)

// Route makes the librdkafka producer configured by cfg (the kafkatx consumer routes
// its own; confluent-kafka-go's admin client takes no log channel) write its log lines to log, named "librdkafka", with
// their facility and syslog level, instead of raw text on stderr. It sets
// go.logs.channel.enable and go.logs.channel unless cfg sets them. Every client of the process
// shares one channel, read by one goroutine that lives as long as the process (the
// examples' clients do too).
func Route(log *zap.Logger, cfg kafka.ConfigMap) kafka.ConfigMap {
	if _, ok := cfg["go.logs.channel.enable"]; ok {
		return cfg
	}
	kafkaLogsOnce.Do(func() {
		kafkaLogs = make(chan kafka.LogEvent, 1000)
		l := log.Named("librdkafka")
		go func() {
			for e := range kafkaLogs {
				l.Check(EventLevel(e), e.Message).Write(zap.String("facility", e.Tag), zap.Int("syslog_level", e.Level), zap.String("client", e.Name))
			}
		}()
	})
	cfg["go.logs.channel.enable"], cfg["go.logs.channel"] = true, kafkaLogs
	return cfg
}

// EventLevel is the zap level of a librdkafka log line: Level of its syslog level, except
// the client-telemetry chatter of KIP-714 (librdkafka 2.5+ asks each broker for a telemetry
// subscription and logs "Telemetry client instance id changed ..." at info level on every
// client), which goes to debug.
func EventLevel(e kafka.LogEvent) zapcore.Level {
	if isTelemetry(e) {
		return zapcore.DebugLevel
	}
	return Level(e.Level)
}

// isTelemetry reports whether e is a KIP-714 client-telemetry line at notice level or below
// (a warning or error about telemetry keeps its level).
func isTelemetry(e kafka.LogEvent) bool {
	if e.Level <= 4 {
		return false
	}
	switch e.Tag {
	case "GETSUBSCRIPTIONS", "PUSHTELEMETRY", "TELEMETRY":
		return true
	}
	return strings.Contains(e.Message, "Telemetry") || strings.Contains(e.Message, "telemetry")
}

// Level maps a syslog level (librdkafka's log_level: 0 emergency … 7 debug) to zap's.
func Level(l int) zapcore.Level {
	switch {
	case l <= 3:
		return zapcore.ErrorLevel
	case l == 4:
		return zapcore.WarnLevel
	case l <= 6:
		return zapcore.InfoLevel
	default:
		return zapcore.DebugLevel
	}
}

// NewAdminClient creates an AdminClient with cfg (copied, not changed) on a producer handle
// whose Go channels are small (kafkaprops.SmallGoChannels): the caller reads the producer's
// Events until Close closes it. Unread, the channel fills with the client-level errors of a
// broker outage (1,000 of them), and the handle's Go poller then waits on it for good: the
// later events, OAUTHBEARER token refreshes among them, stay queued inside librdkafka. It is
// on a producer handle:
// kafka.NewAdminClient takes no log channel, a producer does, so with a non-nil log the
// client's librdkafka lines go through it (Route). Close the admin client, then the producer.
func NewAdminClient(log *zap.Logger, cfg kafka.ConfigMap) (*kafka.AdminClient, *kafka.Producer, error) {
	c := kafka.ConfigMap{}
	for k, v := range cfg {
		c[k] = v
	}
	if log != nil {
		c = Route(log, c)
	}
	kafkaprops.SmallGoChannels(c) // the handle never produces; its channels would be 23 MiB
	p, err := kafka.NewProducer(&c)
	if err != nil {
		return nil, nil, err
	}
	admin, err := kafka.NewAdminClientFromProducer(p)
	if err != nil {
		p.Close()
		return nil, nil, err
	}
	return admin, p, nil
}
