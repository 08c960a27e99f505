package dlq_test

import (
	"strings"
	"testing"
	"time"

	"github.com/kafkatx/kafkatx/dlq"
	"github.com/kafkatx/kafkatx/outbox"
)

// The dead-letter record keeps the original bytes and adds the origin headers.
func TestDeadLetterRecordHeaders(t *testing.T) {
	t.Parallel()
	ts := time.UnixMilli(1700000000123)
	d := &dlq.DeadLetter{ID: 9, Group: "orders-processor", Topic: "orders", Partition: 2, Offset: 41, Key: nil,
		Value: []byte("malformed_message"), Timestamp: ts,
		Headers:    []dlq.Header{{Key: "trace", Value: []byte{0, 1}}, {Key: outbox.HeaderOutboxID, Value: []byte("abc")}},
		ErrorClass: "permanent", ErrorMessage: strings.Repeat("é", 2000), Attempts: 5,
		FirstFailureAt: ts.Add(time.Second), LastFailureAt: ts.Add(2 * time.Second)}
	r := dlq.Record("orders.dlq", d)
	if r.Topic != "orders.dlq" || r.Key != nil || string(r.Value) != "malformed_message" || r.Partition != nil {
		t.Fatalf("record %+v", r)
	}
	got := map[string]string{}
	for i, h := range r.Headers {
		if _, dup := got[h.Key]; dup {
			t.Fatalf("header %s twice", h.Key)
		}
		got[h.Key] = string(h.Value)
		if i == 0 && h.Key != "trace" {
			t.Fatalf("original headers first, got %s", h.Key)
		}
	}
	want := map[string]string{
		"trace": "\x00\x01", dlq.HeaderOriginalOutboxID: "abc",
		"kafkatx.dlq.original.topic": "orders", "kafkatx.dlq.original.partition": "2", "kafkatx.dlq.original.offset": "41",
		"kafkatx.dlq.original.timestamp": "1700000000123", "kafkatx.dlq.group": "orders-processor", "kafkatx.dlq.attempts": "5",
		"kafkatx.dlq.error.class": "permanent", "kafkatx.dlq.first.failure": "1700000001123", "kafkatx.dlq.last.failure": "1700000002123",
		"kafkatx.dlq.id": "9",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("header %s = %q, want %q", k, got[k], v)
		}
	}
	if _, ok := got[outbox.HeaderOutboxID]; ok {
		t.Error("the original kafkatx-outbox-id was kept under its own name")
	}
	msg := got["kafkatx.dlq.error.message"]
	if len(msg) > dlq.MaxErrorMessageHeaderBytes || !strings.HasPrefix(msg, "éé") || !strings.HasSuffix(msg, "é") {
		t.Errorf("error message header: %d bytes, want at most %d cut at a rune boundary", len(msg), dlq.MaxErrorMessageHeaderBytes)
	}
	if len(got) != len(want)+1 {
		t.Errorf("%d headers: %v", len(got), got)
	}
}
