package kafkalog

import (
	"testing"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap/zapcore"
)

// Issue "a user's first week" 7: every client logged "Telemetry client instance id changed"
// at info level; telemetry chatter is debug now, other lines keep their level.
func TestTelemetryChatterIsDebug(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		e    kafka.LogEvent
		want zapcore.Level
	}{
		{kafka.LogEvent{Tag: "GETSUBSCRIPTIONS", Level: 6, Message: "[thrd:main]: Telemetry client instance id changed from AAAA to BOZX"}, zapcore.DebugLevel},
		{kafka.LogEvent{Tag: "PUSHTELEMETRY", Level: 7, Message: "pushing"}, zapcore.DebugLevel},
		{kafka.LogEvent{Tag: "TELEMETRY", Level: 4, Message: "Telemetry push failed"}, zapcore.WarnLevel},
		{kafka.LogEvent{Tag: "FAIL", Level: 3, Message: "Connect to ipv4#127.0.0.1:1 failed"}, zapcore.ErrorLevel},
		{kafka.LogEvent{Tag: "CGRPOP", Level: 6, Message: "Group joined"}, zapcore.InfoLevel},
	} {
		if got := EventLevel(c.e); got != c.want {
			t.Errorf("%s %q (syslog %d): %v, want %v", c.e.Tag, c.e.Message, c.e.Level, got, c.want)
		}
	}
}
