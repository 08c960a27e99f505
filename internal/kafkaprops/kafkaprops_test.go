package kafkaprops

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

func TestReadTakesKeyValueLinesAndNamesABadLineNotItsValue(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := filepath.Join(dir, "good.properties")
	if err := os.WriteFile(good, []byte("\ufeffsecurity.protocol = sasl_ssl\n\n# comment\n! comment\nsasl.password=a=b\nclient.id=x\nclient.id=y\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := kafka.ConfigMap{}
	if err := Read(good, cfg); err != nil {
		t.Fatal(err)
	}
	want := kafka.ConfigMap{"security.protocol": "sasl_ssl", "sasl.password": "a=b", "client.id": "y"}
	if len(cfg) != len(want) {
		t.Fatalf("got %v, want %v", cfg, want)
	}
	for k, v := range want {
		if cfg[k] != v {
			t.Errorf("%s = %v, want %v", k, cfg[k], v)
		}
	}
	bad := filepath.Join(dir, "bad.properties")
	if err := os.WriteFile(bad, []byte("client.id=x\ns3cret-without-equals\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := Read(bad, kafka.ConfigMap{})
	if err == nil || !strings.Contains(err.Error(), "line 2: want key=value") || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("bad line: %v, want line 2 named and no value", err)
	}
	if err := Read(filepath.Join(dir, "missing"), kafka.ConfigMap{}); err == nil {
		t.Error("a missing file read without error")
	}
}

// Every producer handle kafkatx makes gets small Go channels (confluent-kafka-go's
// 1,000,000-slot defaults are 23 MiB of heap the collector scans each cycle); a size the
// caller gives is kept.
func TestSmallGoChannels(t *testing.T) {
	cfg := kafka.ConfigMap{}
	SmallGoChannels(cfg)
	if cfg["go.events.channel.size"] != GoEventsChannelSize || cfg["go.produce.channel.size"] != 1 {
		t.Fatalf("SmallGoChannels set %v", cfg)
	}
	cfg = kafka.ConfigMap{"go.events.channel.size": 50000}
	SmallGoChannels(cfg)
	if cfg["go.events.channel.size"] != 50000 {
		t.Fatalf("a given go.events.channel.size became %v", cfg["go.events.channel.size"])
	}
}
