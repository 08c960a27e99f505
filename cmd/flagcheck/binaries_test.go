package flagcheck_test

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// Issue 36: every bad value is refused alike by every binary — status 2, one line naming the
// flag and the rule — before anything connects: a listener stands in for PostgreSQL and
// Kafka and must see no connection.
func TestEveryBinaryRefusesBadValuesAlike(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var conns atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			c.Close()
		}
	}()
	addr := ln.Addr().String()
	env := []string{"DATABASE_URL=postgres://u:p@" + addr + "/db?connect_timeout=1", "KAFKA_BOOTSTRAP_SERVERS=" + addr}
	// A librdkafka setting it refuses, in a properties file beside a secret: named by property,
	// never by value (they exited 1 from the first client, a second fresh-eyes attack).
	badProps := filepath.Join(t.TempDir(), "bad.properties")
	if err := os.WriteFile(badProps, []byte("sasl.password=s3cret\nsecurity.protocol=bogus-s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	refused := `Invalid value "…" for configuration property "security.protocol"`
	// A producer setting the outbox relays refuse (the examples run one in-process): refused
	// before anything connects, as librdkafka's own refusals are (exit 1 after connecting before).
	acksProps := filepath.Join(t.TempDir(), "acks.properties")
	if err := os.WriteFile(acksProps, []byte("sasl.password=s3cret\nacks=1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	idemProps := filepath.Join(t.TempDir(), "idempotence.properties")
	if err := os.WriteFile(idemProps, []byte("enable.idempotence=false\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	long64 := strings.Repeat("s", 64)
	longTopic := strings.Repeat("t", 250)

	type bad struct {
		args []string
		want string
	}
	// What every consuming binary takes (examples/internal/service.Flags).
	consuming := []bad{
		{[]string{"--schema", ""}, "--schema is empty"},
		{[]string{"--schema", long64}, "--schema " + long64 + " is 64 bytes: PostgreSQL identifiers are at most 63"},
		{[]string{"--group", ""}, "--group is empty"},
		{[]string{"--topic", ""}, "--topic is empty"},
		{[]string{"--topic", "a/b"}, "--topic a/b: Kafka topic names hold only"},
		{[]string{"--topic", longTopic}, "--topic is 250 characters: Kafka topic names are at most 249"},
		{[]string{"--metrics-addr", "nonsense"}, "--metrics-addr nonsense: want HOST:PORT"},
		{[]string{"--metrics-addr", "127.0.0.1:http2"}, "--metrics-addr 127.0.0.1:http2: the port must be a number"},
		{[]string{"--concurrency", "0"}, "--concurrency 0: want 1 to 1,024"},
		{[]string{"--concurrency", "-1"}, "--concurrency -1: want 1 to 1,024"},
		{[]string{"--concurrency", "1025"}, "--concurrency 1025: want 1 to 1,024"},
		{[]string{"--batch-size", "-1"}, "--batch-size -1: want 1 to 100,000"},
		{[]string{"--max-attempts", "1001"}, "--max-attempts 1001: want 1 to 1,000"},
		{[]string{"--exit-when-idle=-1m"}, "--exit-when-idle -1m0s: a duration must not be negative"},
		{[]string{"--exit-when-idle", "1000h"}, "--exit-when-idle 1000h0m0s: want 0s to 24h0m0s"},
		{[]string{"--kafka-config-file", badProps}, refused},
		{[]string{"--topic", strings.Repeat("t", 246)}, "--topic is 246 characters: its dead-letter topic <topic>.dlq would pass Kafka's limit of 249"},
		{[]string{"--kafka-config-file", acksProps}, "acks=1 is refused: the outbox relay publishes with acks=all"},
		{[]string{"--kafka-config-file", idemProps}, "enable.idempotence=false is refused"},
	}
	binaries := []struct {
		pkg  string
		args []string // what the binary needs besides the bad value
		bad  []bad
	}{
		{"github.com/kafkatx/kafkatx/examples/orders", nil, append(consuming,
			bad{[]string{"--events-topic", "a b"}, "--events-topic 'a b': Kafka topic names"},
			bad{[]string{"--poison-every", "-1"}, "--poison-every (-1) must not be negative"},
			bad{[]string{"--generate", "-1"}, "--generate (-1) must not be negative"},
			bad{[]string{"--topic", "orders", "--events-topic", "orders"}, "--events-topic orders: the same topic as --topic"})},
		{"github.com/kafkatx/kafkatx/examples/dagtrigger", []string{"--topic", "t", "--airflow-url", "http://" + addr, "--dag-id", "d"}, append(consuming,
			bad{[]string{"--airflow-timeout", "-1s"}, "--airflow-timeout -1s: a duration must not be negative"},
			bad{[]string{"--airflow-username", "u", "--airflow-password-file", "/nonexistent/pw"}, "--airflow-password-file: open /nonexistent/pw"})},
		{"github.com/kafkatx/kafkatx/examples/dagservice", nil, []bad{
			{[]string{"--schema", ""}, "--schema is empty"},
			{[]string{"--schema", long64}, "is 64 bytes: PostgreSQL identifiers are at most 63"},
			{[]string{"--addr", "nonsense"}, "--addr nonsense: want HOST:PORT"},
			{[]string{"--retention=-1m"}, "--retention -1m0s: a duration must not be negative"},
			{[]string{"--task-delay", "2h"}, "--task-delay 2h0m0s: want 0s to 1h0m0s"},
		}},
		{"github.com/kafkatx/kafkatx/cmd/kafkatx", nil, []bad{
			{[]string{"--schema", "", "dlq", "list"}, "--schema is empty"},
			{[]string{"--schema", long64, "dlq", "list"}, "is 64 bytes: PostgreSQL identifiers are at most 63"},
			{[]string{"-X", "nonsense", "dlq", "list"}, "--kafka-config (-X) nonsense: want key=value"},
			{[]string{"-X", "=v", "dlq", "list"}, "want key=value"},
			{[]string{"-X", "security.protocol=bogus-s3cret", "dlq", "list"}, refused},
			{[]string{"--kafka-config-file", badProps, "relay"}, "--kafka-config-file " + badProps + ": kafka settings: " + refused},
			{[]string{"--kafka-config-file", acksProps, "relay"}, "acks=1 is refused: the outbox relay publishes with acks=all"},
			{[]string{"-X", "request.required.acks=0", "relay"}, "request.required.acks=0 is refused"},
			{[]string{"-X", "acks=s3cret", "relay"}, `Invalid value for configuration property "request.required.acks"`},
			{[]string{"-X", "enable.idempotence=false", "relay"}, "enable.idempotence=false is refused"},
			{[]string{"-X", "transactional.id=s3cret-tx", "relay"}, "transactional.id is refused"},
			{[]string{"-X", "no.such.property=s3cret", "console", "--token-file", "/dev/null"}, `No such configuration property: "no.such.property"`},
			{[]string{"offsets", "status", "--group", ""}, "--group is empty"},
			{[]string{"offsets", "status", "--group", "g", "--topic", ""}, "--topic is empty"},
			{[]string{"offsets", "status", "--group", "g", "--stalled-after=-1m"}, "--stalled-after -1m0s: a duration must not be negative"},
			{[]string{"offsets", "audit", "--group", "g", "--topic", "a:b"}, "--topic a:b: Kafka topic names"},
			{[]string{"offsets", "reset", "--group", "g", "--topic", "t", "--mode", "bogus", "--to-earliest", "--reason", "r"}, `--mode "bogus": want skip, replay or adopt`},
			{[]string{"dlq", "list", "--limit", "-1"}, "--limit -1: want 1 to"},
			{[]string{"dlq", "list", "--group", ""}, "--group is empty"},
			{[]string{"dlq", "list", "--error-class", ""}, "--error-class is empty"},
			{[]string{"dlq", "replay", "1", "--reason", "r", "--to-topic", ".."}, "--to-topic ..: Kafka refuses"},
			{[]string{"relay", "--health-addr", "nonsense"}, "--health-addr nonsense: want HOST:PORT"},
			{[]string{"relay", "--batch-size", "-5"}, "--batch-size -5"},
			{[]string{"console", "--token-file", "/dev/null", "--addr", "nonsense"}, "--addr nonsense: want HOST:PORT"},
		}},
	}
	for _, b := range binaries {
		bin := testenv.BuildPackage(t, b.pkg)
		for _, c := range b.bad {
			testenv.RequireUsageError(t, bin, append(append([]string{}, b.args...), c.args...), env, c.want)
		}
	}
	if n := conns.Load(); n != 0 {
		t.Errorf("%d connections reached the stand-in for PostgreSQL and Kafka: a bad value must be refused before anything connects", n)
	}
}
