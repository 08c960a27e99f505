package kafkatx

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// Tests against the dev broker's SASL_SSL listener (scripts/dev-services up secure): SCRAM-SHA-512
// users, a locally generated CA, ACLs that deny the prefix "denied." to the application user.

// syncBuffer collects a logger's JSON lines from several goroutines.
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

// captureLogger logs everything (debug level, JSON) into the returned buffer.
func captureLogger() (*zap.Logger, *syncBuffer) {
	buf := &syncBuffer{}
	core := zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(buf), zapcore.DebugLevel)
	return zap.New(core), buf
}

func secureConfig(brokers string, props kafka.ConfigMap, group string) kafka.ConfigMap {
	cfg := kafka.ConfigMap{"bootstrap.servers": brokers, "group.id": group, "session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
	for k, v := range props {
		cfg[k] = v
	}
	return cfg
}

// The loop over SASL_SSL: records produced over the secured listener are applied exactly once
// and the offsets committed there; nothing logged carries the password.
func TestConsumerLoopOverSASLSSL(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	sb, props, _ := testenv.SecureKafka(t)
	password := fmt.Sprint(props["sasl.password"])
	const n = 300
	pcfg := secureConfig(sb, props, "")
	delete(pcfg, "group.id")
	delete(pcfg, "session.timeout.ms")
	delete(pcfg, "heartbeat.interval.ms")
	pcfg["enable.idempotence"] = true
	p, err := kafka.NewProducer(&pcfg)
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan kafka.Event, n)
	for i := 0; i < n; i++ {
		if err := p.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &b.topic, Partition: kafka.PartitionAny},
			Key: []byte(fmt.Sprintf("k%d", i)), Value: []byte(fmt.Sprintf("v%d", i))}, ch); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < n; i++ {
		if m := (<-ch).(*kafka.Message); m.TopicPartition.Error != nil {
			t.Fatalf("produce over SASL_SSL: %v", m.TopicPartition.Error)
		}
	}
	p.Close()

	log, buf := captureLogger()
	cfg := b.config(t)
	cfg.Kafka = secureConfig(sb, props, b.group)
	cfg.Logger = log
	r := b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error { return applyEffect(ctx, tx, b.schema, m) }, cfg)
	effects := pgx.Identifier{b.schema, "effects"}.Sanitize()
	waitFor(t, 60*time.Second, "every record applied over SASL_SSL", func() bool {
		return b.q(t, "SELECT count(*) FROM "+effects) == n
	})
	if rd := r.c.Readiness(context.Background()); !rd.Ready {
		t.Fatalf("not ready over SASL_SSL: %v", rd.Reasons)
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if dup := b.q(t, "SELECT count(*) FROM "+effects+" WHERE applied <> 1"); dup != 0 {
		t.Fatalf("%d records applied more than once", dup)
	}
	var sum int64
	for _, off := range b.committedOffsets(t, 2) {
		sum += off
	}
	if sum != n {
		t.Fatalf("committed offsets sum to %d, want %d", sum, n)
	}
	if strings.Contains(buf.String(), password) {
		t.Fatal("the SASL password appears in the consumer's logs")
	}
}

// writeOtherCA writes a CA certificate that did not sign the broker's.
func writeOtherCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "not the dev CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "other-ca.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Every way a secured connection can be refused is one clear error within seconds — in
// Readiness (not ready, AuthError set) and an error-level log line — never a silent stall, and
// the password is in no log line (the right one nor a wrong one).
func TestSecuredListenerRefusalsAreOneClearError(t *testing.T) {
	t.Parallel()
	sb, props, _ := testenv.SecureKafka(t)
	password := fmt.Sprint(props["sasl.password"])
	port := sb[strings.LastIndex(sb, ":")+1:]
	for _, tc := range []struct {
		name      string
		brokers   string
		topic     string // "" : an allowed topic
		group     string // "" : an allowed group
		change    map[string]any
		wantInErr string
	}{
		{name: "wrong password", change: map[string]any{"sasl.password": "wrong-" + password}, wantInErr: "Authentication failed"},
		{name: "wrong CA", change: map[string]any{"ssl.ca.location": ""}, wantInErr: "certificate verify failed"},
		// The broker's certificate names only IP 127.0.0.1 (scripts/dev-services.d/secure.sh).
		{name: "hostname mismatch", brokers: "localhost:" + port, wantInErr: "certificate verify failed"},
		{name: "denied topic", topic: "denied.", wantInErr: "Topic authorization failed"},
		{name: "denied group", group: "denied.", wantInErr: "Group authorization failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 1)
			if tc.topic != "" {
				tc.topic = "denied." + b.topic                     // created over PLAINTEXT, by its super user
				testenv.NamedTopic(t, b.brokers, tc.topic, 1, nil) // over PLAINTEXT
			} else {
				tc.topic = b.topic
			}
			group := b.group
			if tc.group != "" {
				group = tc.group + b.group
			}
			brokers := sb
			if tc.brokers != "" {
				brokers = tc.brokers
			}
			kcfg := secureConfig(brokers, props, group)
			for k, v := range tc.change {
				kcfg[k] = v
			}
			if tc.name == "wrong CA" {
				kcfg["ssl.ca.location"] = writeOtherCA(t)
			}
			log, buf := captureLogger()
			cfg := b.config(t)
			cfg.Kafka, cfg.Topics, cfg.Logger = kcfg, []string{tc.topic}, log
			start := time.Now()
			r := b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error { return applyEffect(ctx, tx, b.schema, m) }, cfg)
			var rd Readiness
			waitFor(t, 60*time.Second, "the refusal in Readiness", func() bool {
				rd = r.c.Readiness(context.Background())
				return rd.AuthError != ""
			})
			if rd.Ready || !strings.Contains(rd.AuthError, tc.wantInErr) {
				t.Fatalf("Readiness after %s: ready=%v auth_error=%q, want not ready naming %q", time.Since(start).Round(time.Millisecond), rd.Ready, rd.AuthError, tc.wantInErr)
			}
			waitFor(t, 60*time.Second, "an error-level log line", func() bool {
				return strings.Contains(buf.String(), `"level":"error"`) && strings.Contains(buf.String(), tc.wantInErr)
			})
			if err := r.stop(t); err != nil {
				t.Fatalf("Run after a refusal: %v (want a clean stop: the library retries, the binary decides)", err)
			}
			if out := buf.String(); strings.Contains(out, password) {
				t.Fatal("a SASL password appears in the logs")
			}
			t.Logf("%s: refused after %s: %s", tc.name, time.Since(start).Round(time.Millisecond), rd.AuthError)
		})
	}
}
