package testenv

import (
	"net"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kafkatx/kafkatx/internal/kafkaprops"
)

// Environment variables of the deployment services (scripts/dev-services up secure pgbouncer).
const (
	EnvSecureBootstrap  = "KAFKA_SECURE_BOOTSTRAP_SERVERS"
	EnvSecureConfigFile = "KAFKA_SECURE_CONFIG_FILE"
	EnvPgBouncerURL     = "PGBOUNCER_URL"
)

// SecureKafka returns the dev broker's SASL_SSL listener and the librdkafka properties of its
// application user (security.protocol, sasl.*, ssl.ca.location), from
// KAFKA_SECURE_BOOTSTRAP_SERVERS and KAFKA_SECURE_CONFIG_FILE; it stops the test (see
// Unavailable) when they are unset or the listener refuses TCP connections. props is a fresh
// map on every call and holds no bootstrap.servers.
func SecureKafka(t testing.TB) (brokers string, props kafka.ConfigMap, file string) {
	t.Helper()
	FullTier(t, "needs the broker's SASL_SSL listener (scripts/dev-services up secure)")
	brokers, file = os.Getenv(EnvSecureBootstrap), os.Getenv(EnvSecureConfigFile)
	if brokers == "" || file == "" {
		Unavailable(t, "%s or %s is not set (scripts/dev-services up secure)", EnvSecureBootstrap, EnvSecureConfigFile)
	}
	c, err := net.Dial("tcp", strings.Split(brokers, ",")[0])
	if err != nil {
		Unavailable(t, "the SASL_SSL listener %s=%s does not accept connections: %v", EnvSecureBootstrap, brokers, err)
	}
	c.Close()
	props = kafka.ConfigMap{}
	if err := kafkaprops.Read(file, props); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return brokers, props, file
}

// ThroughPgBouncer returns dsn (a postgres:// URL of the dev PostgreSQL, e.g. from Database)
// with its host and port replaced by PGBOUNCER_URL's: the same database and role through
// PgBouncer in transaction mode. It stops the test (see Unavailable) when PGBOUNCER_URL is
// unset.
func ThroughPgBouncer(t testing.TB, dsn string) string {
	t.Helper()
	FullTier(t, "needs PgBouncer (scripts/dev-services up pgbouncer)")
	pb := os.Getenv(EnvPgBouncerURL)
	if pb == "" {
		Unavailable(t, "%s is not set (scripts/dev-services up pgbouncer)", EnvPgBouncerURL)
	}
	pu, err := url.Parse(pb)
	if err != nil {
		t.Fatalf("testenv: parse %s: %v", EnvPgBouncerURL, err)
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("testenv: ThroughPgBouncer wants a postgres:// URL: %v", err)
	}
	u.Host = pu.Host
	return u.String()
}
