package kafkatxotel_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/kafkatxotel"
	"github.com/kafkatx/kafkatx/outbox"
)

// The middleware's cost per message in a batch of 5,000 (examples/orders' batch size), with
// the SDK sampling what the producer sampled: untraced messages (non-recording spans), and
// traced ones (recording spans, no exporter) whose outbox record gets the header.
func BenchmarkMiddleware(b *testing.B) {
	for _, traced := range []bool{false, true} {
		name := map[bool]string{false: "untraced", true: "traced"}[traced]
		b.Run(name, func(b *testing.B) {
			tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.NeverSample())))
			tr := kafkatxotel.New(&kafkatxotel.Config{TracerProvider: tp})
			msgs := make([]*kafkatx.Message, 5000)
			for i := range msgs {
				msgs[i] = &kafkatx.Message{Topic: "orders", Offset: int64(i), Attempt: 1}
				if traced {
					msgs[i].Headers = []kafkatx.Header{{Key: "traceparent", Value: []byte(traceparent)}}
				}
			}
			h := tr.Middleware(func(ctx context.Context, tx pgx.Tx, ms []*kafkatx.Message) error {
				for _, m := range ms {
					if traced {
						var r outbox.Record
						tr.InjectOutbox(m.Context(), &r)
					}
				}
				return nil
			})
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				_ = h(context.Background(), nil, msgs)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(msgs)), "ns/msg")
		})
	}
}
