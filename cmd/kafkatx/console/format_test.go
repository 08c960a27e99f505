package console

import (
	"strings"
	"testing"
)

// A payload is indented JSON when it is JSON, else a hex dump; nil is null; past 64 KiB the
// dump is cut and says so.
func TestPayloadFormats(t *testing.T) {
	t.Parallel()
	if p := payloadOf([]byte(`{"order":1,"items":[2,3]}`)); p.Format != "json" || !strings.Contains(p.Text, "\n  \"order\": 1") || p.Size != 25 {
		t.Fatalf("JSON payload %+v", p)
	}
	if p := payloadOf([]byte("poison\x00\xff")); p.Format != "hex" || !strings.Contains(p.Text, "70 6f 69 73 6f 6e 00 ff") {
		t.Fatalf("binary payload %+v", p)
	}
	if p := payloadOf(nil); p.Format != "null" {
		t.Fatalf("nil payload %+v", p)
	}
	big := payloadOf([]byte(strings.Repeat("x", maxPayloadShown+10)))
	if big.Format != "hex" || !big.Truncated || big.Size != maxPayloadShown+10 {
		t.Fatalf("large payload: format %s, truncated %v, size %d", big.Format, big.Truncated, big.Size)
	}
}

// Failures that differ only in numbers, ids or hex runs share a fingerprint; another message,
// class, topic or group does not.
func TestFingerprintGroupsFailuresAlike(t *testing.T) {
	t.Parallel()
	a := fingerprint("g", "orders", "permanent", "cannot decode order 42 at offset 7: bad byte 0xdeadbeef01\nstack...")
	b := fingerprint("g", "orders", "permanent", "cannot decode order 9 at offset 1234: bad byte 0x0123456789  ")
	c := fingerprint("g", "orders", "permanent", "order 3b1f6a2e-4f0c-4f7e-9a51-7d0c2b8a1e90 not found")
	d := fingerprint("g", "orders", "permanent", "order 0f1e2d3c-aaaa-bbbb-cccc-123456789abc not found")
	if a != b || c != d || a == c {
		t.Fatalf("fingerprints %s %s %s %s: want a = b, c = d, a != c", a, b, c, d)
	}
	for _, other := range []string{
		fingerprint("g", "orders", "transient", "cannot decode order 42 at offset 7: bad byte 0xdeadbeef01"),
		fingerprint("g", "payments", "permanent", "cannot decode order 42 at offset 7: bad byte 0xdeadbeef01"),
		fingerprint("h", "orders", "permanent", "cannot decode order 42 at offset 7: bad byte 0xdeadbeef01"),
	} {
		if other == a {
			t.Fatalf("fingerprint %s shared across class, topic or group", a)
		}
	}
	if n := normalizeMessage("a  1\tb 22\nsecond line"); n != "a # b #" {
		t.Fatalf("normalized %q", n)
	}
}

// A summary names the whole size and hash and shows at most 32 bytes, marking a cut.
func TestSummaryOfAPrefix(t *testing.T) {
	t.Parallel()
	if s := summaryOf([]byte("poison-3"), 8, []byte{0xb8, 0x06, 0x94, 0x1e, 0xff}); s != `8 B sha256:b806941e "poison-3"` {
		t.Fatalf("summary %q", s)
	}
	if s := summaryOf([]byte(strings.Repeat("a", 32)), 5000, []byte{1, 2, 3, 4}); !strings.HasPrefix(s, "5000 B sha256:01020304 \"aaaa") || !strings.HasSuffix(s, "\"…") {
		t.Fatalf("summary of a cut value %q", s)
	}
	if s := summaryOf(nil, 0, nil); s != "null" {
		t.Fatalf("summary of nil %q", s)
	}
}

// What the consumer does next is the classifier's decision in words.
func TestNextStepFollowsTheClassifier(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		r    PartitionRow
		want string
	}{
		{PartitionRow{State: "aligned", Watermark: 10, Committed: 10, LogStart: 0, LogEnd: 15}, "resumes at 10"},
		{PartitionRow{State: "kafka_ahead", Watermark: 10, Committed: 15, LogStart: 0, LogEnd: 15}, "follows Kafka: audits [10, 15) as a skip and starts at 15"},
		{PartitionRow{State: "kafka_behind", Watermark: 10, Committed: 4, LogStart: 0, LogEnd: 15}, "starts at the watermark 10 and commits it to Kafka"},
		{PartitionRow{State: "kafka_missing", Watermark: 10, Committed: -1, LogStart: 0, LogEnd: 15}, "starts at the watermark 10 and commits it to Kafka"},
		{PartitionRow{State: "no_watermark", Watermark: -1, Committed: 7, LogStart: 0, LogEnd: 15}, "first run: starts at Kafka's committed offset 7"},
		{PartitionRow{State: "watermark_past_log_end", Watermark: 20, Committed: 20, LogStart: 0, LogEnd: 15}, "processes nothing: the watermark 20 is past the log end 15"},
		{PartitionRow{State: "watermark_below_log_start", Watermark: 3, Committed: 12, LogStart: 5, LogEnd: 15},
			"audits [3, 5) as an unexplained skip (removed by retention), then follows Kafka: audits [5, 12) as a skip and starts at 12"},
		{PartitionRow{State: "kafka_past_log_end", Watermark: 10, Committed: 99, LogStart: 0, LogEnd: 15},
			"ignores Kafka's committed offset 99 (past the log end), then starts at the watermark 10 and commits it to Kafka"},
		{PartitionRow{State: "log_changed", Watermark: 10, Committed: -1, LogStart: 0, LogEnd: 15, LogChange: "topic id A -> B"},
			"processes nothing: the log behind the watermark changed (topic id A -> B); an operator adopts the new log (offsets reset --mode adopt)"},
	} {
		if got := nextStep(c.r); !strings.HasPrefix(got, c.want) {
			t.Errorf("%s W=%d K=%d: %q, want %q", c.r.State, c.r.Watermark, c.r.Committed, got, c.want)
		}
	}
}
