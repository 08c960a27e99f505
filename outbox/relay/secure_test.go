package relay

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
)

// No kafkatx producer uses Kafka transactions (the relay's exactly-once comes from the outbox
// id, the consumer commits offsets itself), so a denied transactional id cannot stall one. A
// transactional.id given to the relay is refused by New, at once and by name, rather than
// failing every produce outside a transaction.
func TestNewRefusesATransactionalID(t *testing.T) {
	_, err := New(new(pgxpool.Pool), &Config{Kafka: kafka.ConfigMap{"bootstrap.servers": "127.0.0.1:1", "transactional.id": "denied.relay"}})
	if err == nil || !strings.Contains(err.Error(), "transactional.id is refused") {
		t.Fatalf("New with a transactional.id: %v, want a refusal naming transactional.id", err)
	}
}

// lockedBuffer collects log lines from several goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// The relay over the SASL_SSL listener (scripts/dev-services up secure) with a row for a
// topic the application user may not write (ACL: DENY on "denied.*"): the row is parked
// within seconds with one error line naming the authorization failure, other rows flow, and
// no log line carries the password.
func TestRelayDeniedTopicOverSASLSSLIsOneClearError(t *testing.T) {
	t.Parallel()
	sb, props, _ := testenv.SecureKafka(t)
	b := setup(t)
	allowed := testenv.Topic(t, b.brokers, 1)
	denied := "denied." + allowed
	testenv.NamedTopic(t, b.brokers, denied, 1, nil) // over PLAINTEXT: its super user may
	buf := &lockedBuffer{}
	cfg := b.config(t)
	cfg.Logger = zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(buf), zapcore.DebugLevel))
	cfg.Kafka = kafka.ConfigMap{"bootstrap.servers": sb}
	for k, v := range props {
		cfg.Kafka[k] = v
	}
	ids := b.write(t, outbox.Record{Topic: denied, Key: []byte("k"), Value: []byte("refused")})
	for i := 0; i < 20; i++ {
		b.write(t, outbox.Record{Topic: allowed, Key: []byte(fmt.Sprint(i)), Value: []byte("ok")})
	}
	start := time.Now()
	b.start(t, cfg)
	waitFor(t, 60*time.Second, "the denied row parked", func() bool { return b.states(t)[ids[0]] == "parked" })
	took := time.Since(start)
	waitCount(t, b.brokers, allowed, 20, 30*time.Second)
	var lastErr string
	_ = b.pool.QueryRow(context.Background(), `SELECT coalesce(last_error, '') FROM `+b.t.Outbox+` WHERE id = $1`, ids[0]).Scan(&lastErr)
	logs := buf.String()
	parkedLines := 0
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, `"level":"error"`) && strings.Contains(l, "outbox row parked") && strings.Contains(l, "Topic authorization failed") {
			parkedLines++
		}
	}
	t.Logf("denied topic: parked after %s; last_error %q; %d error line(s)", took.Round(time.Millisecond), lastErr, parkedLines)
	if !strings.Contains(lastErr, "Topic authorization failed") {
		t.Fatalf("parked row's error %q does not name the authorization failure", lastErr)
	}
	if parkedLines != 1 {
		t.Fatalf("%d error lines naming the parked row's authorization failure, want 1", parkedLines)
	}
	if pw := fmt.Sprint(props["sasl.password"]); pw == "" || strings.Contains(logs, pw) {
		t.Fatal("the SASL password appears in the relay's logs (or the test has none)")
	}
}
