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
