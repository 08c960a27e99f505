package kafkaprops

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// A setting librdkafka refuses is an error naming the property and never the value (which
// may be a secret); settings it accepts — consumer ones included — are not.
func TestCheckNamesTheRefusedPropertyNotItsValue(t *testing.T) {
	for _, c := range []struct {
		cfg  kafka.ConfigMap
		want string // "" accepted
	}{
		{kafka.ConfigMap{"bootstrap.servers": "127.0.0.1:1", "security.protocol": "sasl_ssl", "sasl.mechanism": "SCRAM-SHA-512",
			"sasl.username": "u", "sasl.password": "s3cret-pw", "group.id": "g", "auto.offset.reset": "earliest", "go.logs.channel.enable": true}, ""},
		{kafka.ConfigMap{"security.protocol": "bogus-s3cret"}, `"security.protocol"`},
		{kafka.ConfigMap{"no.such.property": "s3cret"}, `"no.such.property"`},
		{kafka.ConfigMap{"session.timeout.ms": "s3cret"}, `"session.timeout.ms"`},
		{kafka.ConfigMap{"auto.offset.reset": "s3cret"}, `"auto.offset.reset"`},
		{kafka.ConfigMap{"linger.ms": "-5"}, `"queue.buffering.max.ms"`}, // librdkafka names linger.ms's alias
		// A second fresh-eyes attack: values outside quotes, and a property name in them.
		{kafka.ConfigMap{"security.protocol": "sasl_plaintext", "sasl.mechanism": "s3cret-mech"}, "SASL mechanism"},
		{kafka.ConfigMap{"partitioner": "s3cret"}, `"partitioner"`},
		{kafka.ConfigMap{"enable.idempotence": "s3cret"}, `"enable.idempotence"`},
		{kafka.ConfigMap{"message.max.bytes": "100"}, `"message.max.bytes"`},
	} {
		err := Check(c.cfg)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("Check(%v): %v", c.cfg, err)
		case c.want != "" && err == nil:
			t.Errorf("Check(%v) accepted it", c.cfg)
		case c.want != "" && !strings.Contains(err.Error(), c.want):
			t.Errorf("Check: %v; want it to name %s", err, c.want)
		case c.want != "" && (strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "-5")):
			t.Errorf("Check: %v shows the value", err)
		case c.want != "" && strings.Contains(err.Error(), "\n"):
			t.Errorf("Check: %q is not one line", err)
		}
	}
}

// A properties file saved with a UTF-8 byte-order mark (Windows editors) read as a first key
// "\ufeffbootstrap.servers", which librdkafka refused as an unknown property whose name looked
// like the right one.
func TestReadSkipsAByteOrderMark(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bom.properties")
	if err := os.WriteFile(path, []byte("\ufeffsecurity.protocol=plaintext\n# \ufeff not at the start: kept\nclient.id=x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := kafka.ConfigMap{}
	if err := Read(path, cfg); err != nil {
		t.Fatal(err)
	}
	if v, ok := cfg["security.protocol"]; !ok || v != "plaintext" {
		t.Fatalf("security.protocol after a byte-order mark: %v (%v), want plaintext; keys %v", v, ok, cfg)
	}
	if err := Check(cfg); err != nil {
		t.Fatalf("Check after Read: %v", err)
	}
}

// librdkafka names a refused value by its canonical property (request.required.acks for a
// bad acks): the error adds the name the settings used.
func TestCheckNamesTheAliasUsed(t *testing.T) {
	for _, c := range []struct {
		cfg  kafka.ConfigMap
		want string
	}{
		{kafka.ConfigMap{"acks": "s3cret"}, `"request.required.acks" (set as acks)`},
		{kafka.ConfigMap{"linger.ms": "-5"}, `"queue.buffering.max.ms" (set as linger.ms)`},
		{kafka.ConfigMap{"compression.type": "s3cret"}, `"compression.codec" (set as compression.type)`},
	} {
		err := Check(c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("Check(%v) = %v, want an error with %q and no value", c.cfg, err, c.want)
		}
	}
	if err := Check(kafka.ConfigMap{"request.required.acks": "bogus-x"}); err == nil || strings.Contains(err.Error(), "set as") {
		t.Errorf("the canonical name set: %v, want an error without an alias note", err)
	}
}

// A value that is part of a property name ("ssl" of security.protocol=ssl) no longer cuts the
// name: the error read "….key.location failed" (a fresh-eyes attack).
func TestRedactKeepsPropertyNamesWhole(t *testing.T) {
	cfg := kafka.ConfigMap{"security.protocol": "ssl", "ssl.key.location": "/nonexistent-s3cret"}
	got := Redact(`ssl.key.location failed: /nonexistent-s3cret: No such file`, cfg)
	if want := `ssl.key.location failed: …: No such file`; got != want {
		t.Fatalf("Redact = %q, want %q", got, want)
	}
}
