package canary

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

// Issue "outages" 4: the failure paths of an outage — a broker down mid-produce, a topic the
// ACLs deny, a handler that panics — with real credentials in use: the SASL_SSL listener's
// application password (`scripts/dev-services up secure`) must not show in any output, in
// any of the forms leaks checks, with librdkafka's debug output on.

// secure returns the SASL_SSL listener, a properties file of its application user with
// librdkafka's debug contexts dbg added, and the user's password (the secret to look for).
func secure(t *testing.T, dbg string) (brokers, file, password string, props kafka.ConfigMap) {
	t.Helper()
	brokers, props, src := testenv.SecureKafka(t)
	password, _ = props["sasl.password"].(string)
	if len(password) < 8 {
		t.Fatalf("the secure listener's password in %s is %d bytes; the test needs one that cannot show by chance", src, len(password))
	}
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	file = filepath.Join(t.TempDir(), "kafka.properties")
	if err := os.WriteFile(file, append(b, []byte("\ndebug="+dbg+"\n")...), 0o600); err != nil {
		t.Fatal(err)
	}
	props["debug"] = dbg
	return brokers, file, password, props
}

// checkSecret fails t for every form of secret (forms) found in any output of o.
func checkSecret(t *testing.T, o *output, secret string) {
	t.Helper()
	for name, b := range o.by {
		for _, f := range forms(secret) {
			if i := strings.Index(b.String(), f); i >= 0 {
				t.Errorf("%s shows the SASL password (as %q): …%s…", name, f, b.String()[max(0, i-120):i])
			}
		}
	}
}

// A topic the ACLs deny (the events topic `denied.…`, which the application user may not
// write) and a handler that panics (an in-process consumer over SASL_SSL, its logs at debug
// level with librdkafka's debug=all): the failure shows, the password does not — in the logs,
// the dead-letter rows or the outbox rows.
func TestNoSecretWhenATopicIsDeniedOrAHandlerPanics(t *testing.T) {
	dsn := testenv.Database(t)
	plain := testenv.Brokers(t)
	sb, file, password, props := secure(t, "all")
	out := &output{by: map[string]*bytes.Buffer{}}
	bin := build(t, t.TempDir(), "examples/orders")

	t.Run("denied topic", func(t *testing.T) {
		topic := testenv.Topic(t, plain, 1)
		denied := testenv.NamedTopic(t, plain, "denied."+topic, 1, nil) // created by the plaintext super user
		text := run(t, []string{"KAFKATX_LOG_LEVEL=debug"}, 40*time.Second, bin, "--database-url", dsn, "--brokers", sb,
			"--kafka-config-file", file, "--topic", topic, "--group", testenv.Group(t), "--events-topic", denied,
			"--generate", "20", "--exit-when-idle", "5s")
		out.add("orders, events topic denied", text)
		if !strings.Contains(strings.ToLower(text), "authorization failed") {
			t.Errorf("orders with a denied events topic: no authorization failure in its output:\n%.2000s", text)
		}
	})

	t.Run("handler panic", func(t *testing.T) {
		topic := testenv.Topic(t, plain, 1)
		testenv.Produce(t, plain, topic, []kafka.Message{{Value: []byte("boom")}})
		pool, err := pgxpool.New(context.Background(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		var logs syncBuffer
		log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(&logs), zap.DebugLevel))
		kc := kafka.ConfigMap{"bootstrap.servers": sb, "group.id": testenv.Group(t)}
		for k, v := range props {
			kc[k] = v
		}
		c, err := kafkatx.NewConsumer(pool, func(ctx context.Context, tx pgx.Tx, m *kafkatx.Message) error {
			panic(fmt.Sprintf("handler panic at offset %d", m.Offset))
		}, &kafkatx.Config{Kafka: kc, Topics: []string{topic}, Logger: log,
			Retry: kafkatx.RetryPolicy{MaxAttempts: 2, InitialBackoff: 10 * time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		for c.Stats().DeadLettered < 1 && ctx.Err() == nil {
			time.Sleep(100 * time.Millisecond)
		}
		cancel()
		<-done
		if c.Stats().DeadLettered != 1 {
			t.Fatalf("the panicking message was not dead-lettered within 90 s (stats %+v)", c.Stats())
		}
		out.add("in-process consumer over SASL_SSL, handler panic, logs", logs.String())
		if !strings.Contains(logs.String(), "handler panic at offset") {
			t.Errorf("the logs do not show the panic")
		}
	})

	tablesOf(t, dsn, out)
	checkSecret(t, out, password)
	out.check(t)
}

// A broker SIGKILLed while orders produces over SASL_SSL (librdkafka's broker, security,
// protocol and metadata debug contexts on): the producer's failures show, the password does
// not. It kills this worktree's development broker: `make test-outages` runs it alone.
func TestNoSecretWhenTheBrokerDiesMidProduce(t *testing.T) {
	testenv.NeedBrokerKills(t)
	dsn := testenv.Database(t)
	plain := testenv.Brokers(t)
	sb, file, password, _ := secure(t, "broker,security,protocol,metadata")
	out := &output{by: map[string]*bytes.Buffer{}}
	bin := build(t, t.TempDir(), "examples/orders")
	topic := testenv.Topic(t, plain, 3)
	done := make(chan string, 1)
	go func() {
		done <- run(t, []string{"KAFKATX_LOG_LEVEL=debug"}, 3*time.Minute, bin, "--database-url", dsn, "--brokers", sb,
			"--kafka-config-file", file, "--topic", topic, "--group", testenv.Group(t),
			"--generate", "300000", "--exit-when-idle", "5s")
	}()
	time.Sleep(2 * time.Second) // the produce phase is under way
	testenv.KillBroker(t, plain, 5*time.Second)
	text := <-done
	out.add("orders, broker killed mid-produce", text)
	if !strings.Contains(text, "Connection refused") && !strings.Contains(text, "Disconnected") && !strings.Contains(text, "failed") {
		t.Errorf("orders' output shows no broker failure:\n%.2000s", text)
	}
	tablesOf(t, dsn, out)
	checkSecret(t, out, password)
	out.check(t)
}

// tablesOf adds what kafkatx stored in dsn's database (dead letters, outbox, attempts) to o.
func tablesOf(t *testing.T, dsn string, o *output) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, table := range []string{"dead_letters", "outbox", "attempts"} {
		var text string
		err := pool.QueryRow(context.Background(), `SELECT coalesce(string_agg(t::text, E'\n'), '') FROM kafkatx.`+table+` t`).Scan(&text)
		if err != nil {
			t.Errorf("table %s: %v", table, err)
			continue
		}
		o.add("table kafkatx."+table, text)
	}
}

// syncBuffer is a bytes.Buffer safe for the logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
