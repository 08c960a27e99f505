package main

import (
	"context"
	"os"

	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/kafkatxotel"
	"github.com/kafkatx/kafkatx/outbox"
)

// tracing is the service's OpenTelemetry setup: an SDK tracer provider (it makes the
// consumer's span ids, so a traced order's event names the consumer's span as its parent)
// sampling what the producers sampled (ParentBased). Roots — the batch spans, and the spans of
// orders without traceparent — are sampled only with --trace-stderr, which writes the sampled
// spans to stderr as JSON, one per line; a real service would export with OTLP instead.
type tracing struct {
	provider *sdktrace.TracerProvider
	tracer   *kafkatxotel.Tracer
}

func newTracing(toStderr bool) (*tracing, error) {
	root := sdktrace.NeverSample()
	opts := []sdktrace.TracerProviderOption{}
	if toStderr {
		exp, err := stdouttrace.New(stdouttrace.WithWriter(os.Stderr))
		if err != nil {
			return nil, err
		}
		root = sdktrace.AlwaysSample()
		opts = append(opts, sdktrace.WithBatcher(exp))
	}
	tp := sdktrace.NewTracerProvider(append(opts, sdktrace.WithSampler(sdktrace.ParentBased(root)))...)
	return &tracing{provider: tp, tracer: kafkatxotel.New(&kafkatxotel.Config{TracerProvider: tp})}, nil
}

// annotate carries the trace context of an order's message to its event: for orders that
// came with a traceparent header (and all of them with --trace-stderr). Untraced orders'
// events get no header, which keeps a batch of them on the outbox's COPY path.
func (t *tracing) annotate(all bool) func(m *kafkatx.Message, ev *outbox.Record) {
	return func(m *kafkatx.Message, ev *outbox.Record) {
		if _, ok := m.Header("traceparent"); ok || all {
			t.tracer.InjectOutbox(m.Context(), ev)
		}
	}
}

// shutdown flushes the sampled spans still buffered.
func (t *tracing) shutdown(ctx context.Context) error { return t.provider.Shutdown(ctx) }
