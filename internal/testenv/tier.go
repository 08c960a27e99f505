package testenv

import "testing"

// The suite has two tiers (README "Running the tests", docs/testing.md):
//
//   - the short tier, `go test -short` (`make test-short`): PostgreSQL and one plain broker
//     (`scripts/dev-services up` with nothing extra), nothing killed, nothing else started;
//   - the full tier, plain `go test` (`make test`, what CI runs): every real system — the
//     extra dev services (secure, connect, airflow, pgbouncer, kafka2, patroni), clusters of a
//     test's own (initdb), headless Chromium — and, under `make test-outages`, the tests that
//     kill or freeze the broker.
//
// A test leaves the short tier through FullTier, called by the helper that hands out a full-tier
// system (SecureKafka, ThroughPgBouncer, SecondBrokers, StartOwnPostgres, NeedBrokerKills,
// internal/cdctest.ConnectURL, ...) or by the test itself when it is slow for another reason.
// That is a choice of tier, not a missing service: in the full tier a missing service still
// fails the test under CI (Unavailable).

// FullTier skips the test in the short tier (go test -short), naming what keeps it out: what is
// a short phrase such as "needs Kafka Connect (scripts/dev-services up connect)". In the full
// tier it does nothing.
func FullTier(t testing.TB, what string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("full tier only (make test), skipped by -short (make test-short): %s", what)
	}
}
