package main

import (
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

const (
	inTrace     = "4bf92f3577b34da6a3ce929d0e0e4736"
	inSpan      = "00f067aa0ba902b7"
	traceparent = "00-" + inTrace + "-" + inSpan + "-01"
)

// The order service carries trace context per order: the event of an order produced with a
// traceparent carries the same trace id and the consumer span's id as its parent; an untraced
// order's event has none (with --trace-stderr it gets the batch span's, and the spans are
// written to stderr); a poison message's .dlq record keeps its original traceparent.
func TestOrdersCarryTraceContextToEventsAndDeadLetters(t *testing.T) {
	t.Parallel()
	brokers := testenv.Brokers(t)
	db := testenv.Database(t)
	bin := buildOrders(t)
	for _, toStderr := range []bool{false, true} {
		topic := testenv.Topic(t, brokers, 1)
		events := topic + ".events"
		testenv.Produce(t, brokers, topic, []kafka.Message{
			{Key: []byte("o-t1"), Value: []byte(`{"order_id":"o-t1-` + topic + `","customer":"c","item":"book","quantity":1,"price":1.5}`), Headers: tp()},
			{Key: []byte("o-t2"), Value: []byte(`{"order_id":"o-t2-` + topic + `","customer":"c","item":"book","quantity":1,"price":1.5}`)},
			{Key: []byte("o-t3"), Value: []byte("not json"), Headers: tp()},
		})
		args := []string{"--brokers", brokers, "--database-url", db, "--topic", topic, "--group", topic, "--events-topic", events, "--exit-when-idle", "3s"}
		if toStderr {
			args = append(args, "--trace-stderr")
		}
		r := runOrders(t, bin, 120*time.Second, args...)
		if r.code != 0 {
			t.Fatalf("orders: exit %d; stderr:\n%s", r.code, tail(r.stderr))
		}
		evs := testenv.Read(t, brokers, events, 2)
		for _, m := range evs {
			h, ok := headerOf(m, "traceparent")
			traced := strings.HasPrefix(string(m.Key), "o-t1")
			switch {
			case traced && (!strings.HasPrefix(h, "00-"+inTrace+"-") || strings.Contains(h, inSpan)):
				t.Fatalf("--trace-stderr=%v: traced order's event has traceparent %q, want trace %s with a new parent span", toStderr, h, inTrace)
			case !traced && !toStderr && ok:
				t.Fatalf("untraced order's event has traceparent %q", h)
			case !traced && toStderr && (!ok || strings.Contains(h, inTrace)):
				t.Fatalf("--trace-stderr: untraced order's event has traceparent %q, want its batch span's", h)
			}
		}
		dl := testenv.Read(t, brokers, topic+".dlq", 1)
		if h, _ := headerOf(dl[0], "traceparent"); h != traceparent {
			t.Fatalf(".dlq record traceparent %q, want the original %q", h, traceparent)
		}
		if spans := strings.Contains(r.stderr, `"Name":"process `+topic+`"`); spans != toStderr {
			t.Fatalf("--trace-stderr=%v: spans on stderr: %v", toStderr, spans)
		}
	}
}

func tp() []kafka.Header { return []kafka.Header{{Key: "traceparent", Value: []byte(traceparent)}} }

func headerOf(m *kafka.Message, key string) (string, bool) {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}
