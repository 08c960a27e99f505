package kafkatxotel_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/kafkatxotel"
	"github.com/kafkatx/kafkatx/outbox"
	"github.com/kafkatx/kafkatx/outbox/relay"
)

const (
	producerTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	producerSpan  = "00f067aa0ba902b7"
	traceparent   = "00-" + producerTrace + "-" + producerSpan + "-01"
)

// End to end on the real broker and PostgreSQL: a consumed message's traceparent starts a
// child span (the consumer's), the outbox record written for it carries that span's context,
// the relay publishes it; an untraced message's span hangs under its batch's; a poison
// message's dead letter keeps its original traceparent, in the table and on the .dlq record.
func TestTraceContextFromConsumedMessageToPublishedEventAndDeadLetter(t *testing.T) {
	pool := testenv.Postgres(t)
	brokers := testenv.Brokers(t)
	schema := testenv.Schema(t, pool)
	in := testenv.Topic(t, brokers, 1)
	events := testenv.Topic(t, brokers, 1)
	dlqTopic := testenv.Topic(t, brokers, 1)
	group := "g-" + in
	ctx := context.Background()
	if err := kafkatx.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	testenv.Produce(t, brokers, in, []kafka.Message{
		{Key: []byte("a"), Value: []byte("order a"), Headers: []kafka.Header{{Key: "traceparent", Value: []byte(traceparent)}, {Key: "tracestate", Value: []byte("vendor=x")}}},
		{Key: []byte("b"), Value: []byte("order b")},
		{Key: []byte("c"), Value: []byte("poison"), Headers: []kafka.Header{{Key: "traceparent", Value: []byte(traceparent)}, {Key: "other", Value: []byte{0, 0xff}}}},
	})

	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(ctx) //nolint:errcheck
	tr := kafkatxotel.New(&kafkatxotel.Config{TracerProvider: tp})
	w := outbox.Writer{Schema: schema}
	handler := func(ctx context.Context, tx pgx.Tx, msgs []*kafkatx.Message) error {
		for _, m := range msgs {
			if string(m.Value) == "poison" {
				return kafkatx.FailMessage(m, kafkatx.Permanent(errors.New("not an order")))
			}
			r := outbox.Record{Topic: events, Key: m.Key, Value: append([]byte("applied "), m.Value...)}
			tr.InjectOutbox(m.Context(), &r)
			if _, err := w.WriteTx(ctx, tx, r); err != nil {
				return err
			}
		}
		return nil
	}
	c, err := kafkatx.NewBatchConsumer(pool, handler, &kafkatx.Config{
		Kafka:      kafka.ConfigMap{"bootstrap.servers": brokers, "group.id": group, "session.timeout.ms": 6000},
		Topics:     []string{in},
		Schema:     schema,
		Logger:     zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)),
		Middleware: []kafkatx.Middleware{tr.Middleware},
		DeadLetter: kafkatx.DeadLetterConfig{Topic: func(string) string { return dlqTopic }},
	})
	if err != nil {
		t.Fatal(err)
	}
	rl, err := relay.New(pool, &relay.Config{Kafka: kafka.ConfigMap{"bootstrap.servers": brokers}, Schema: schema,
		Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)), PollInterval: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 2)
	go func() { done <- c.Run(runCtx) }()
	go func() { done <- rl.Run(runCtx) }()
	got := testenv.Read(t, brokers, events, 2)
	dl := testenv.Read(t, brokers, dlqTopic, 1)
	cancel()
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}

	spans := rec.Ended()
	msgSpan := func(offset int64) sdktrace.ReadOnlySpan {
		var last sdktrace.ReadOnlySpan
		for _, s := range spans {
			if v, ok := attr(s, "messaging.kafka.offset"); ok && v.AsInt64() == offset {
				last = s // the last try's span
			}
		}
		if last == nil {
			t.Fatalf("no span for offset %d among %d spans", offset, len(spans))
		}
		return last
	}
	a := msgSpan(0)
	// a continues the producer's trace, as its child.
	if a.Parent().TraceID().String() != producerTrace || a.Parent().SpanID().String() != producerSpan || !a.Parent().IsRemote() {
		t.Fatalf("span of a has parent %v, want the producer's span %s", a.Parent(), producerSpan)
	}
	if a.SpanContext().TraceState().Get("vendor") != "x" {
		t.Fatalf("span of a lost the tracestate: %q", a.SpanContext().TraceState().String())
	}
	if a.Name() != "process "+in || a.SpanKind() != trace.SpanKindConsumer {
		t.Fatalf("span of a: name %q kind %v", a.Name(), a.SpanKind())
	}
	for k, want := range map[string]string{"messaging.system": "kafka", "messaging.destination.name": in, "messaging.destination.partition.id": "0",
		"messaging.consumer.group.name": group, "messaging.operation.name": "process", "messaging.operation.type": "process"} {
		if v, _ := attr(a, k); v.String() != want {
			t.Fatalf("span of a: %s = %q, want %q", k, v.String(), want)
		}
	}
	if v, _ := attr(a, "kafkatx.attempt"); v.AsInt64() != 1 {
		t.Fatalf("span of a: kafkatx.attempt = %v", v.String())
	}
	// a links to its batch's span, which links back to a's producer.
	var batchOfA sdktrace.ReadOnlySpan
	for _, s := range spans {
		if len(a.Links()) == 1 && s.SpanContext().SpanID() == a.Links()[0].SpanContext.SpanID() {
			batchOfA = s
		}
	}
	if batchOfA == nil || len(batchOfA.Links()) == 0 || batchOfA.Links()[0].SpanContext.SpanID().String() != producerSpan {
		t.Fatalf("span of a links %v: no batch span linking to the producer", a.Links())
	}
	if n, _ := attr(batchOfA, "messaging.batch.message_count"); n.AsInt64() < 1 || batchOfA.Parent().IsValid() {
		t.Fatalf("batch span: count %v, parent %v (want a root)", n.String(), batchOfA.Parent())
	}
	// b had no trace context: no span of its own; its batch's span covers it.
	for _, s := range spans {
		if v, ok := attr(s, "messaging.kafka.offset"); ok && v.AsInt64() == 1 {
			t.Fatalf("a span for the untraced message: %v", s.SpanContext())
		}
	}
	var b sdktrace.ReadOnlySpan
	for _, s := range spans {
		if n, _ := attr(s, "messaging.batch.message_count"); n.AsInt64() > 0 && s.Status().Code != codes.Error {
			b = s // the batch that committed b (the last try without an error)
		}
	}
	// The published events carry the consumer span's context: same trace, new parent span.
	for _, m := range got {
		tpHeader := header(m, "traceparent")
		span := map[string]sdktrace.ReadOnlySpan{"a": a, "b": b}[string(m.Key)]
		want := fmt.Sprintf("00-%s-%s-01", span.SpanContext().TraceID(), span.SpanContext().SpanID())
		if tpHeader != want {
			t.Fatalf("event %s: traceparent %q, want %q (its consumer span)", m.Key, tpHeader, want)
		}
		if string(m.Key) == "a" && (!strings.Contains(tpHeader, producerTrace) || strings.Contains(tpHeader, producerSpan)) {
			t.Fatalf("event a: traceparent %q, want trace %s with a new parent span", tpHeader, producerTrace)
		}
	}
	// The poison message's try failed with its span's status Error; its dead letter keeps the
	// original headers byte for byte, in the table and on the dead-letter record.
	if c := msgSpan(2); c.Status().Code != codes.Error || c.Parent().SpanID().String() != producerSpan {
		t.Fatalf("span of the poison message: status %v, parent %v", c.Status(), c.Parent())
	}
	var keys, vals [][]byte
	if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT header_keys, header_values FROM %s WHERE "offset" = 2`, pgx.Identifier{schema, "dead_letters"}.Sanitize())).Scan(&keys, &vals); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 || string(keys[0]) != "traceparent" || string(vals[0]) != traceparent || string(keys[1]) != "other" || string(vals[1]) != "\x00\xff" {
		t.Fatalf("dead letter headers %q = %q", keys, vals)
	}
	if h := header(dl[0], "traceparent"); h != traceparent {
		t.Fatalf(".dlq record traceparent %q, want the original %q", h, traceparent)
	}
}

// InjectOutbox writes traceparent and tracestate, replacing earlier ones and leaving other
// headers (and a shared headers slice) alone; without a span context it writes nothing.
func TestInjectOutbox(t *testing.T) {
	tr := kafkatxotel.New(nil)
	shared := []outbox.Header{{Key: "traceparent", Value: []byte("stale")}, {Key: "x", Value: []byte("1")}}
	r := outbox.Record{Topic: "t", Headers: shared}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: mustTrace(producerTrace), SpanID: mustSpan(producerSpan), TraceFlags: trace.FlagsSampled})
	tr.InjectOutbox(trace.ContextWithSpanContext(context.Background(), sc), &r)
	if len(r.Headers) != 2 || r.Headers[0].Key != "x" || r.Headers[1].Key != "traceparent" || string(r.Headers[1].Value) != traceparent {
		t.Fatalf("headers %+v", r.Headers)
	}
	if string(shared[0].Value) != "stale" {
		t.Fatal("InjectOutbox wrote into the caller's headers slice")
	}
	r2 := outbox.Record{Topic: "t"}
	tr.InjectOutbox(context.Background(), &r2)
	if len(r2.Headers) != 0 {
		t.Fatalf("headers %+v from a context without a span", r2.Headers)
	}
}

// The middleware passes the handler's answers through unchanged, marks the named message's
// span and the batch's as failed, ends every span, and lets a panic go on to kafkatx.
func TestMiddlewareOutcomes(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	mw := kafkatxotel.New(&kafkatxotel.Config{TracerProvider: tp, UntracedMessageSpans: true}).Middleware
	msgs := func() []*kafkatx.Message {
		return []*kafkatx.Message{{Topic: "t", Offset: 5, Attempt: 1}, {Topic: "t", Offset: 6, Attempt: 1}}
	}
	boom := errors.New("boom")
	err := mw(func(ctx context.Context, tx pgx.Tx, ms []*kafkatx.Message) error {
		if !trace.SpanContextFromContext(ms[1].Context()).IsValid() {
			t.Error("message context carries no span")
		}
		return kafkatx.FailMessage(ms[1], boom)
	})(context.Background(), nil, msgs())
	var me *kafkatx.MessageError
	if !errors.As(err, &me) || me.Offset != 6 || !errors.Is(err, boom) {
		t.Fatalf("err = %v", err)
	}
	ended := rec.Ended()
	if len(ended) != 3 {
		t.Fatalf("%d spans ended, want 3", len(ended))
	}
	status := map[string]codes.Code{}
	for _, s := range ended {
		off, ok := attr(s, "messaging.kafka.offset")
		status[map[bool]string{true: fmt.Sprint(off.AsInt64()), false: "batch"}[ok]] = s.Status().Code
	}
	if status["batch"] != codes.Error || status["6"] != codes.Error || status["5"] != codes.Unset {
		t.Fatalf("statuses %v", status)
	}
	func() {
		defer func() {
			if r := recover(); r != "handler bug" {
				t.Fatalf("recovered %v, want the handler's panic", r)
			}
		}()
		_ = mw(func(context.Context, pgx.Tx, []*kafkatx.Message) error { panic("handler bug") })(context.Background(), nil, msgs())
	}()
	if n := len(rec.Ended()); n != 6 {
		t.Fatalf("%d spans ended after the panic, want 6", n)
	}
}

func attr(s sdktrace.ReadOnlySpan, key string) (attribute.Value, bool) {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

func header(m *kafka.Message, key string) string {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func mustTrace(s string) trace.TraceID {
	id, err := trace.TraceIDFromHex(s)
	if err != nil {
		panic(err)
	}
	return id
}

func mustSpan(s string) trace.SpanID {
	id, err := trace.SpanIDFromHex(s)
	if err != nil {
		panic(err)
	}
	return id
}

// The consumer loop, the outbox and the relay compile without OpenTelemetry: only this
// package (and what imports it) depends on it.
func TestCoreDoesNotImportOpenTelemetry(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/kafkatx/kafkatx", "github.com/kafkatx/kafkatx/outbox",
		"github.com/kafkatx/kafkatx/outbox/relay", "github.com/kafkatx/kafkatx/dlq").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "go.opentelemetry.io/") {
			t.Fatalf("the core depends on %s", pkg)
		}
	}
}
