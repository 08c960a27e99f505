// Package kafkatxotel carries OpenTelemetry trace context through kafkatx: a middleware that
// continues, for each consumed message, the trace of its producer (the W3C Trace Context
// headers traceparent and tracestate), and a helper that writes the current trace context
// into the headers of an outbox record, which the relay publishes as they are.
//
// It is a package of its own, as River keeps otelriver apart, so that the kafkatx consumer
// loop does not depend on OpenTelemetry: a service that does not trace does not compile it.
//
// Spans, all of kind CONSUMER and named "process <topic>" (OpenTelemetry's semantic
// conventions for messaging, "process" operation):
//   - one per batch transaction's handler call, a child of the handler's context, with
//     messaging.batch.message_count and a link to each message's producer context;
//   - one per message that carries a trace context (traceparent), a child of the producer's
//     span, with a link to the batch's span. A message without one is covered by its batch's
//     span alone, and its context (kafkatx.Message.Context) is the batch span's; set
//     Config.UntracedMessageSpans to give it a span of its own too, a child of the batch's.
//
// Both carry messaging.system=kafka, messaging.destination.name (the topic),
// messaging.destination.partition.id, messaging.consumer.group.name (kafkatx.GroupFromContext),
// messaging.operation.name=process and messaging.operation.type=process; message spans also
// messaging.kafka.offset, messaging.message.id (the kafkatx-outbox-id header, for records a
// kafkatx relay published), messaging.kafka.message.tombstone for a nil value and
// kafkatx.attempt. Keys and values are never recorded.
//
// A batch handler gets each message's own context, carrying its span, from
// kafkatx.Message.Context (the middleware sets it with SetContext); an outbox record written
// for that message carries the message's trace context when the handler calls
// Tracer.InjectOutbox with it. kafkatxotel is the one package that injects: the outbox and
// the relay copy headers byte for byte and know nothing of tracing, and dead letters keep the
// consumed message's headers, its traceparent included.
//
// The spans cover the handler's work inside the transaction; the COMMIT that follows is
// reported by kafkatx.HookBatchCommitted (and kafkatx_batch_duration_seconds). A batch that
// kafkatx re-runs to isolate a failing message yields new spans for the re-run: each try is
// its own span, the failed one with status Error.
package kafkatxotel

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/outbox"
)

// ScopeName is the instrumentation scope of kafkatxotel's tracer.
const ScopeName = "github.com/kafkatx/kafkatx/kafkatxotel"

// AttributeAttempt is the message span's attribute for kafkatx.Message.Attempt (1 on a
// message's first try, counted durably across crashes).
const AttributeAttempt = attribute.Key("kafkatx.attempt")

// Config configures a Tracer. A nil *Config means all defaults.
type Config struct {
	// TracerProvider creates the spans. Defaults to otel.GetTracerProvider() (a no-op until
	// the application sets one: no-op spans carry the producer's context on unchanged).
	TracerProvider trace.TracerProvider
	// Propagator reads a message's headers and writes an outbox record's. Defaults to
	// propagation.TraceContext{} (W3C Trace Context: traceparent and tracestate), not the
	// global propagator, which is a no-op until the application sets one; pass
	// otel.GetTextMapPropagator() to use the application's (with Baggage, for example).
	Propagator propagation.TextMapPropagator
	// UntracedMessageSpans starts a span also for each message without a trace context in
	// its headers, as a child of its batch's span. Defaults to false: such a message is
	// covered by the batch's span, which spares a span per message (measured: about 5 µs and
	// 10 allocations per message in a batch of 5,000 on a loaded 2-core machine,
	// BenchmarkMiddleware).
	UntracedMessageSpans bool
	// MaxLinks bounds the links of a batch span to its messages' producer contexts (the
	// SDK's own default limit is 128 links per span). Defaults to 128; negative: no links.
	MaxLinks int
}

// Tracer creates kafkatx's spans and injects trace context into outbox records. Create one
// with New; it is safe for concurrent use.
type Tracer struct {
	tracer   trace.Tracer
	prop     propagation.TextMapPropagator
	maxLinks int
	untraced bool
}

// New returns a Tracer for cfg (nil: all defaults).
func New(cfg *Config) *Tracer {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.Propagator == nil {
		c.Propagator = propagation.TraceContext{}
	}
	if c.MaxLinks == 0 {
		c.MaxLinks = 128
	}
	return &Tracer{tracer: c.TracerProvider.Tracer(ScopeName), prop: c.Propagator, maxLinks: c.MaxLinks, untraced: c.UntracedMessageSpans}
}

// Middleware is a kafkatx.Middleware (give it as Config.Middleware: []kafkatx.Middleware{t.Middleware}):
// it starts the batch span and one span per message (see the package doc), sets each
// message's context to its span's (kafkatx.Message.Context), calls next, and ends the spans
// with next's outcome: an error or panic sets status Error on the batch span and, when it
// names its message (kafkatx.FailMessage, or the per-message Handler's failure), on that
// message's span. It changes nothing in what next returns; a panic goes on to kafkatx, which
// recovers it as the handler's. Put it first in Config.Middleware so that its spans cover the
// other middleware.
func (t *Tracer) Middleware(next kafkatx.BatchHandler) kafkatx.BatchHandler {
	return func(ctx context.Context, tx pgx.Tx, msgs []*kafkatx.Message) (err error) {
		if len(msgs) == 0 {
			return next(ctx, tx, msgs)
		}
		group, _ := kafkatx.GroupFromContext(ctx)
		first := msgs[0]
		common := []attribute.KeyValue{
			semconv.MessagingSystemKafka,
			semconv.MessagingDestinationName(first.Topic),
			semconv.MessagingDestinationPartitionID(strconv.Itoa(int(first.Partition))),
			semconv.MessagingOperationName("process"),
			semconv.MessagingOperationTypeProcess,
		}
		if group != "" {
			common = append(common, semconv.MessagingConsumerGroupName(group))
		}
		name := "process " + first.Topic
		parents := make([]context.Context, len(msgs))
		var links []trace.Link
		for i, m := range msgs {
			parents[i] = t.prop.Extract(ctx, headerCarrier{m: m})
			if sc := trace.SpanContextFromContext(parents[i]); sc.IsValid() && sc.IsRemote() && len(links) < t.maxLinks {
				links = append(links, trace.Link{SpanContext: sc})
			}
		}
		batchAttrs := append(common[:len(common):len(common)], semconv.MessagingBatchMessageCount(len(msgs)))
		bctx, batch := t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithLinks(links...), trace.WithAttributes(batchAttrs...))
		batchLink := trace.Link{SpanContext: batch.SpanContext()}
		spans := make([]trace.Span, len(msgs))
		for i, m := range msgs {
			parent := parents[i]
			if !trace.SpanContextFromContext(parent).IsValid() {
				if !t.untraced {
					m.SetContext(bctx) // no producer context: the batch's span covers the message
					continue
				}
				parent = bctx // the message's span hangs under its batch's
			}
			attrs := append(common[:len(common):len(common)], semconv.MessagingKafkaOffset(int(m.Offset)), AttributeAttempt.Int(m.Attempt))
			if id, ok := m.Header(outbox.HeaderOutboxID); ok {
				attrs = append(attrs, semconv.MessagingMessageID(string(id)))
			}
			if m.Value == nil {
				attrs = append(attrs, semconv.MessagingKafkaMessageTombstone(true))
			}
			mctx, span := t.tracer.Start(parent, name, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithLinks(batchLink), trace.WithAttributes(attrs...))
			spans[i] = span
			m.SetContext(mctx)
		}
		defer func() {
			r := recover()
			failed := err
			if r != nil {
				failed = fmt.Errorf("panic: %v", r)
			}
			if failed != nil {
				batch.RecordError(failed)
				batch.SetStatus(codes.Error, failed.Error())
				var me *kafkatx.MessageError
				if errors.As(failed, &me) {
					for i, m := range msgs {
						if m.Offset == me.Offset && spans[i] != nil {
							spans[i].RecordError(me.Err)
							spans[i].SetStatus(codes.Error, me.Err.Error())
						}
					}
				} else if len(msgs) == 1 && spans[0] != nil {
					spans[0].RecordError(failed)
					spans[0].SetStatus(codes.Error, failed.Error())
				}
			}
			for _, s := range spans {
				if s != nil {
					s.End()
				}
			}
			batch.End()
			if r != nil {
				panic(r)
			}
		}()
		return next(bctx, tx, msgs)
	}
}

// InjectOutbox writes the trace context of ctx — for a message of a batch, its
// kafkatx.Message.Context() — into r's headers with the Tracer's propagator (traceparent and
// tracestate by default), replacing headers of those names, so that the record the relay
// publishes continues the trace. A ctx without a valid span context writes nothing.
func (t *Tracer) InjectOutbox(ctx context.Context, r *outbox.Record) {
	t.prop.Inject(ctx, &outboxCarrier{r: r})
}

// headerCarrier reads a consumed message's headers for the propagator (the last header of a
// name wins, as kafkatx.Message.Header).
type headerCarrier struct{ m *kafkatx.Message }

func (c headerCarrier) Get(key string) string {
	v, _ := c.m.Header(key)
	return string(v)
}

func (c headerCarrier) Set(string, string) {} // extraction only

func (c headerCarrier) Keys() []string {
	keys := make([]string, len(c.m.Headers))
	for i, h := range c.m.Headers {
		keys[i] = h.Key
	}
	return keys
}

// outboxCarrier writes an outbox record's headers for the propagator.
type outboxCarrier struct{ r *outbox.Record }

func (c *outboxCarrier) Get(key string) string {
	for i := len(c.r.Headers) - 1; i >= 0; i-- {
		if c.r.Headers[i].Key == key {
			return string(c.r.Headers[i].Value)
		}
	}
	return ""
}

// Set replaces the headers named key with one, in a new slice: the record's may be shared.
func (c *outboxCarrier) Set(key, value string) {
	hs := make([]outbox.Header, 0, len(c.r.Headers)+1)
	for _, h := range c.r.Headers {
		if h.Key != key {
			hs = append(hs, h)
		}
	}
	c.r.Headers = append(hs, outbox.Header{Key: key, Value: []byte(value)})
}

func (c *outboxCarrier) Keys() []string {
	keys := make([]string, len(c.r.Headers))
	for i, h := range c.r.Headers {
		keys[i] = h.Key
	}
	return keys
}
