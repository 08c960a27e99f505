package main

import (
	"os"
	"strings"
	"testing"

	"github.com/kafkatx/kafkatx/examples/internal/service"
)

// Issue 48, defect 6: an empty --events-topic is no usage error — orders runs and writes no
// events (the benchmarks' orders-noevents relies on it) — and docs/examples.md says so; a
// name Kafka refuses still is one.
func TestEmptyEventsTopicIsNoEvents(t *testing.T) {
	o := options{Flags: service.Flags{Topic: "orders"}}
	if err := o.checkEventsTopic(); err != nil {
		t.Fatalf("--events-topic '': %v, want no error", err)
	}
	o.eventsTopic = "bad topic"
	if err := o.checkEventsTopic(); err == nil {
		t.Fatal("--events-topic 'bad topic': no error")
	}
	doc, err := os.ReadFile("../../docs/examples.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(strings.Fields(string(doc)), " "), "`orders --events-topic ''` is no error: it runs and publishes no events") {
		t.Fatal("docs/examples.md does not say that an empty --events-topic runs and publishes no events")
	}
}
