# kafkatx — development targets. `make test` is what CI runs (.ci/run).
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c

GO ?= go
# -race costs a slower first build (cgo, librdkafka) and ~2x test time; kept in the full tier
# (make test, CI). The short tier (make test-short) runs without it.
GOTESTFLAGS ?= -race -count=1 -timeout 30m
SHORTTESTFLAGS ?= -short -count=1 -timeout 20m
PKGS ?= ./...
# The Go modules whose tests `make test` and `make test-short` run: each directory's $(PKGS),
# from inside it (go test ./... at the root does not enter a nested module).
MODULES ?= .
# Orders for the demo: 8 orders and 1 poison pill (examples/orders/testdata/README.md).
DEMO_DATA ?= examples/orders/testdata/orders.jsonl

.PHONY: test test-short test-main test-services test-services-down test-kafka2 test-outages services-up services-down services-status demo lint browser

# go test $(1) over $(PKGS) of every module in $(MODULES); every module runs, and the loop fails
# when one of them failed.
define gotest_modules
rc=0; for m in $(MODULES); do \
  echo "go test $(strip $(1)) $(PKGS) (module $$m)"; \
  (cd "$$m" && $(GO) test $(1) $(PKGS)) || rc=1; \
done; exit $$rc
endef

# Extra dev services the tests need (scripts/dev-services.d/NAME.sh), started by `make test`:
# connect — Kafka Connect 4.3.1 with the Debezium 3.6.1.Final PostgreSQL connector for the CDC
# tests (jars fetched once with Maven); airflow — a real Apache Airflow 3 for examples/dagtrigger's
# end-to-end test (first start installs it into .dev/airflow, about a minute with pip's cache).
# secure — the broker's SASL_SSL listener with ACLs; pgbouncer — PgBouncer in transaction mode
# (the first start apt-get installs it): the deployment tests (deploy_test.go and others).
# kafka2 — a second broker of another Kafka line (KAFKA2_VERSION, default 4.1.2) for test-kafka2;
# started with the others so its jars are there for internal/devservices' version-switch test.
# patroni — a high-availability PostgreSQL (Patroni 3.0 with etcd, two PostgreSQL 15 nodes; the
# first start apt-get installs Debian's patroni and etcd packages) for the failover tests.
# secure comes first: adding the listener restarts the broker, which the others then find up.
TEST_SERVICES ?= secure connect airflow pgbouncer kafka2 patroni
# The ones `make test` stops when it ends (secure stays: `down secure` would restart the broker).
TEST_SERVICES_DOWN ?= $(filter-out secure,$(TEST_SERVICES))
# The stages of `make test`, in order; each runs even when an earlier one failed.
TEST_STAGES ?= test-services test-main test-kafka2 test-outages

## test: the full tier, what CI runs (.ci/run): every stage of $(TEST_STAGES) — start PostgreSQL,
## the broker, $(TEST_SERVICES) and headless Chromium (test-services), every test with -race
## (test-main), the KAFKA2_TESTS subset on a second Kafka line (test-kafka2), the broker-killing
## tests alone (test-outages) — then stop $(TEST_SERVICES_DOWN). Every stage runs even when one
## fails; one line per stage says how it went; the exit status is non-zero when any failed.
test:
	@rc=0; summary=""; \
	for stage in $(TEST_STAGES); do \
	  start=$$SECONDS; \
	  if $(MAKE) --no-print-directory $$stage; then r=ok; else r=FAILED; rc=1; fi; \
	  summary+="make test: stage $$stage $$r ($$((SECONDS - start)) s)"$$'\n'; \
	  echo "make test: stage $$stage $$r ($$((SECONDS - start)) s)"; \
	done; \
	if $(MAKE) --no-print-directory test-services-down; then r=ok; else r=FAILED; rc=1; fi; \
	summary+="make test: stage test-services-down $$r"$$'\n'; \
	echo "make test: summary"; printf '%s' "$$summary"; \
	if ((rc == 0)); then echo "make test: ok"; else echo "make test: FAILED"; fi; \
	exit $$rc

## test-services: start PostgreSQL, the broker and $(TEST_SERVICES); install headless Chromium
test-services: services-up browser
	scripts/dev-services up $(TEST_SERVICES)

## test-services-down: stop $(TEST_SERVICES_DOWN) (PostgreSQL and the broker stay for the next run)
test-services-down:
	scripts/dev-services down $(TEST_SERVICES_DOWN)

## test-main: every test of $(MODULES) with $(GOTESTFLAGS) on the running services (CI=true:
## a missing service fails its tests)
test-main:
	eval "$$(scripts/dev-services env)"; \
	export CI="$${CI:-true}"; \
	$(call gotest_modules,$(GOTESTFLAGS))

## test-short: the short tier: PostgreSQL and one plain broker only (scripts/dev-services up,
## nothing extra), go test -short: no broker killed or frozen, no extra service, no cluster of a
## test's own, no browser (testenv.FullTier skips those tests, saying so). A few minutes.
test-short: services-up
	eval "$$(scripts/dev-services env)"; \
	export CI="$${CI:-true}"; \
	$(call gotest_modules,$(SHORTTESTFLAGS))

# The subset run against the second Kafka line: the loop, poison pills, rebalances (classic and
# KIP-848, members joining, leaving, fenced, SIGKILLed), the reconciliation of database and Kafka
# offsets, and the relay (order, failover, murmur2, parking). About 2 minutes.
KAFKA2_TESTS ?= ^(TestConsumerAppliesEachMessageOnceAndCommitsAfterTheDatabase|TestFailingMessageIsRetriedThenDeadLetteredAloneInOrder|TestSecondConsumerJoiningMidStreamAddsNoDuplicateEffect|TestZombieCannotCommitPastAFencedWatermark|TestSIGKILLAtEachStepLeavesAnExactEndState|TestFencedStaticMemberEndsRun|TestKIP848.*|TestKafkaBehindOrMissingResumesFromTheWatermark|TestKafkaAheadIsFollowedAndAuditedAsAnUnexplainedSkip|TestRecordsRemovedBeforeProcessingAreAuditedNotCountedAsProcessed|TestWatermarkPastTheLogEndHaltsWithBothOffsets|TestTopicRecreatedUnderTheSameNameRefusesToStart|TestPartitionAddedStartsWhereConfigSaysAndIsAudited|TestCommittedOffsetPastTheLogEndIsIgnored|TestSameKeyRecordsArePublishedInCommitOrderWithTwoRelays|TestKilledBetweenProduceAndMarkRepublishesWithSameIDs|TestStandbyTakesOverWhenTheLeaderIsKilled|TestKeyedRecordsArePartitionedWithMurmur2|TestTooLargeRecordParksWithoutBlockingOtherKeys|TestDeadLetterReplayRoundTrip)$$
KAFKA2_PKGS ?= . ./outbox/relay/

# The tests that SIGKILL the development broker (ten times each), alone: every other test of a
# parallel run would meet the outage too. One package at a time (-p 1): a package's test that
# starts while another package's test has the broker down fails at once (CI: the relays'
# frozen-broker tests started during the main package's broker restarts). About 25 minutes (the broker's restart dominates).
# The broker runs with its SASL_SSL listener (secure): the canary's broker kill produces over it.
OUTAGE_TESTS ?= ^(TestStaticMemberRidesOutBrokerRestarts|TestBrokerKilledDuringABackpressureHoldLeavesNoPartitionBehind|TestTopicRecreatedWhileRunningAtAHigherLeaderEpochIsNotFollowed|TestNoSecretWhenTheBrokerDiesMidProduce|TestStaticMemberRidesOutAFrozenBroker|TestDynamicMemberRidesOutAFrozenBroker|TestReadyReportsAFrozenBroker|TestStopWithTheBrokerFrozenIsBounded)$$

## test-outages: run $(OUTAGE_TESTS) (KAFKATX_BROKER_KILL_TESTS=1), which kill and restart, or freeze (SIGSTOP), the broker
test-outages: services-up
	scripts/dev-services up secure
	eval "$$(scripts/dev-services env)"; \
	export CI="$${CI:-true}" KAFKATX_BROKER_KILL_TESTS=1; \
	$(GO) test $(GOTESTFLAGS) -p 1 -timeout 60m -run '$(OUTAGE_TESTS)' . ./internal/canary/ ./outbox/relay/ ./outbox/walrelay/

## test-kafka2: run $(KAFKA2_TESTS) against a second broker of another Kafka line
## (scripts/dev-services up kafka2: Apache Kafka $$KAFKA2_VERSION, default 4.1.2), then stop it
test-kafka2: services-up
	scripts/dev-services up kafka2
	eval "$$(scripts/dev-services env)"; \
	export CI="$${CI:-true}" KAFKA_BOOTSTRAP_SERVERS="$$KAFKA2_BOOTSTRAP_SERVERS"; \
	echo "test-kafka2: Apache Kafka $$KAFKA2_VERSION at $$KAFKA_BOOTSTRAP_SERVERS"; \
	$(GO) test $(GOTESTFLAGS) -run '$(KAFKA2_TESTS)' $(KAFKA2_PKGS)
	scripts/dev-services down kafka2

## browser: headless Chromium for the console's real-browser test (console/browser_test.go):
## Debian's chromium package, apt-get installed once when missing (scripts/install-browser)
browser:
	scripts/install-browser >/dev/null

## services-up: start (or reuse) PostgreSQL and the Kafka broker; print their addresses
services-up:
	scripts/dev-services up
	@scripts/dev-services env

## services-down: stop what services-up started
services-down:
	scripts/dev-services down

services-status:
	scripts/dev-services status

## demo: the order service on PostgreSQL and an in-process Kafka broker (no JVM needed),
## on a fresh database each run; prints the summary and the tables
demo:
	scripts/demo $(DEMO_DATA)

## lint: static checks (go vet and staticcheck, pinned)
lint:
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

## bench: kafkatx's throughput, latency and memory against the PostgreSQL ceiling for the same
## writes and a naive loop, and the whole pipeline (consume, apply, publish) as examples/orders
## runs it, in one run on this machine (docs/benchmarks.md). Not a CI test. Flags through
## BENCHFLAGS, e.g. BENCHFLAGS='-backlog 1000000 -cpuprofile-dir /tmp/prof' or
## BENCHFLAGS='-soak 10m -e2e-backlog 1000000 -scale 1,2,3' (run from the repository root).
.PHONY: bench
bench: services-up
	eval "$$(scripts/dev-services env)"; \
	$(GO) run ./examples/internal/bench $(BENCHFLAGS)
