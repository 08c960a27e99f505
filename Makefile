# kafkatx — development targets. `make test` is what CI runs (.ci/run).
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c

GO ?= go
# Tests that call t.Parallel run PARALLEL at a time in a package (go test's default is the
# number of CPUs, 2 here): the suite's tests wait on the broker, PostgreSQL and the other
# services far more than they compute. The root package's short tier took 105 s at 4 and 208 s
# at 2 (the same 326 s of tests, run one after the other at load average 20 on 2 cores).
# PARALLEL=2 gives go test's default back.
PARALLEL ?= 4
# -race costs a slower first build (cgo, librdkafka) and ~2x test time; kept in the full tier
# (make test, CI). The short tier (make test-short) runs without it.
GOTESTFLAGS ?= -race -count=1 -parallel $(PARALLEL) -timeout 30m
# The short tier also runs 4 packages at a time (-p 4; go test's default is the number of CPUs):
# 4m25s against 8m02s for the same 40 packages (their times summed 830 s and 752 s), measured
# one after the other on 2 cores at load averages 5–21 and 22–27.
SHORTTESTFLAGS ?= -short -count=1 -p 4 -parallel $(PARALLEL) -timeout 20m
PKGS ?= ./...
# The repository's Go modules (each its own go.mod): the library, the kafkatx command with its
# console (cmd), the examples. Targets run go through scripts/go-modules, which runs it in each
# module; package paths (PKGS, KAFKA2_PKGS, the outage packages) are the repository's, each run
# in the module that holds it, ./... in every module (go test ./... at the root does not enter a
# nested module).
MODULES ?= . cmd examples
export MODULES
GOMODS := GO=$(GO) scripts/go-modules
# Orders for the demo: 8 orders and 1 poison pill (examples/orders/testdata/README.md).
DEMO_DATA ?= examples/orders/testdata/orders.jsonl

.PHONY: test test-short test-main test-airflow test-services test-services-down test-kafka2 test-outages test-outages-own test-outages-main services-up services-down services-status demo lint browser

# go test $(1) over $(PKGS) in every module of $(MODULES) (scripts/go-modules); every module
# runs, and it fails when one of them failed.
define gotest_modules
$(GOMODS) test $(1) -- $(PKGS)
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
# What `make test` stops when it ends: the extras and the outage broker (secure stays: `down
# secure` would restart the broker; PostgreSQL and the broker stay for the next run).
TEST_SERVICES_DOWN ?= $(filter-out secure,$(TEST_SERVICES)) outage

## test: the full tier, what CI runs (.ci/run). Its stages: start PostgreSQL, the broker,
## $(TEST_SERVICES) and headless Chromium (test-services); then, on a broker of their own, the
## broker-killing tests (test-outages-own) and, in a go test of their own, the real-Airflow
## tests (test-airflow), beside, in turn, every other test with -race (test-main),
## the KAFKA2_TESTS subset on a second Kafka line (test-kafka2) and, once test-airflow is done,
## the tests that kill the main broker (test-outages-main); last, stop $(TEST_SERVICES_DOWN) (test-services-down). Every
## stage runs even when one failed; one line per stage says how it went (`make test: stage NAME
## ok|FAILED (N s)`), a summary ends the run, and the exit status is non-zero when any failed.
## The lines of test-outages-own and test-airflow are prefixed with their names (they
## interleave with the others').
test:
	@rc=0; summary=""; \
	result() { summary+="make test: stage $$1 $$2 ($$3 s)"$$'\n'; echo "make test: stage $$1 $$2 ($$3 s)"; [[ $$2 == ok ]] || rc=1; }; \
	stage() { local start=$$SECONDS r=ok; $(MAKE) --no-print-directory "$$1" || r=FAILED; result "$$1" $$r $$((SECONDS - start)); }; \
	stage test-services; \
	start=$$SECONDS; \
	( $(MAKE) --no-print-directory test-outages-own 2>&1 | sed -u 's/^/test-outages-own: /' ) & outages=$$!; \
	( $(MAKE) --no-print-directory test-airflow 2>&1 | sed -u 's/^/test-airflow: /' ) & airflow=$$!; \
	stage test-main; \
	stage test-kafka2; \
	r=ok; wait $$airflow || r=FAILED; result test-airflow $$r $$((SECONDS - start)); \
	stage test-outages-main; \
	r=ok; wait $$outages || r=FAILED; result test-outages-own $$r $$((SECONDS - start)); \
	stage test-services-down; \
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
## a missing service fails its tests), but $(AIRFLOW_TESTS), which test-airflow runs
test-main:
	eval "$$(scripts/dev-services env)"; \
	export CI="$${CI:-true}"; \
	$(call gotest_modules,$(GOTESTFLAGS) -skip '$(AIRFLOW_TESTS)')

# The tests against the real Airflow (examples/dagtrigger, about 3 minutes each, one after the
# other): `make test` runs them in a go test of their own beside test-main, so that they overlap
# the same package's CDC tests (Kafka Connect; a stand-in Airflow) instead of following them.
AIRFLOW_TESTS ?= ^TestRealAirflow
AIRFLOW_TESTS_PKGS ?= ./examples/dagtrigger/ ./cmd/kafkatx/ ./idempotency/airflow/

## test-airflow: $(AIRFLOW_TESTS) against the real Airflow (scripts/dev-services up airflow)
test-airflow: services-up
	scripts/dev-services up airflow
	eval "$$(scripts/dev-services env)"; \
	export CI="$${CI:-true}"; \
	$(GOMODS) test $(GOTESTFLAGS) -run '$(AIRFLOW_TESTS)' -- $(AIRFLOW_TESTS_PKGS)

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

# The tests that SIGKILL the broker (up to ten times each) or freeze it (SIGSTOP), alone on
# their broker: every other test on it would meet the outage too. One package at a time (-p 1):
# a package's test that starts while another package's test has the broker down fails at once.
# OUTAGE_TESTS run on a broker of their own (scripts/dev-services up outage: the main broker's
# version and settings, KAFKATX_BROKER_KILL_SERVICE=outage so that testenv.KillBroker brings it
# back), so `make test` runs them beside the main suite (test-outages-own). OUTAGE_MAIN_TESTS
# kill the main broker, which has the SASL_SSL listener (secure) the canary produces over: they
# run after the main suite, alone (test-outages-main).
OUTAGE_TESTS ?= ^(TestStaticMemberRidesOutBrokerRestarts|TestBrokerKilledDuringABackpressureHoldLeavesNoPartitionBehind|TestTopicRecreatedWhileRunningAtAHigherLeaderEpochIsNotFollowed|TestStaticMemberRidesOutAFrozenBroker|TestDynamicMemberRidesOutAFrozenBroker|TestReadyReportsAFrozenBroker|TestStopWithTheBrokerFrozenIsBounded)$$
OUTAGE_PKGS ?= . ./outbox/relay/ ./outbox/walrelay/
OUTAGE_MAIN_TESTS ?= ^(TestNoSecretWhenTheBrokerDiesMidProduce)$$
OUTAGE_MAIN_PKGS ?= ./internal/canary/

## test-outages: the tests that kill and restart, or freeze (SIGSTOP), a broker
## (KAFKATX_BROKER_KILL_TESTS=1): test-outages-own, then test-outages-main
test-outages:
	$(MAKE) --no-print-directory test-outages-own
	$(MAKE) --no-print-directory test-outages-main

## test-outages-own: $(OUTAGE_TESTS) against the outage broker (scripts/dev-services up outage)
test-outages-own: services-up
	scripts/dev-services up outage
	eval "$$(scripts/dev-services env)"; \
	export CI="$${CI:-true}" KAFKATX_BROKER_KILL_TESTS=1 KAFKATX_BROKER_KILL_SERVICE=outage \
	  KAFKA_BOOTSTRAP_SERVERS="$$KAFKATX_OUTAGE_BOOTSTRAP_SERVERS"; \
	echo "test-outages-own: the outage broker at $$KAFKA_BOOTSTRAP_SERVERS"; \
	$(GOMODS) test $(GOTESTFLAGS) -p 1 -timeout 60m -run '$(OUTAGE_TESTS)' -- $(OUTAGE_PKGS)

## test-outages-main: $(OUTAGE_MAIN_TESTS), which kill the main broker (with its SASL_SSL listener)
test-outages-main: services-up
	scripts/dev-services up secure
	eval "$$(scripts/dev-services env)"; \
	export CI="$${CI:-true}" KAFKATX_BROKER_KILL_TESTS=1; \
	$(GOMODS) test $(GOTESTFLAGS) -p 1 -timeout 30m -run '$(OUTAGE_MAIN_TESTS)' -- $(OUTAGE_MAIN_PKGS)

## test-kafka2: run $(KAFKA2_TESTS) against a second broker of another Kafka line
## (scripts/dev-services up kafka2: Apache Kafka $$KAFKA2_VERSION, default 4.1.2), then stop it
test-kafka2: services-up
	scripts/dev-services up kafka2
	eval "$$(scripts/dev-services env)"; \
	export CI="$${CI:-true}" KAFKA_BOOTSTRAP_SERVERS="$$KAFKA2_BOOTSTRAP_SERVERS"; \
	echo "test-kafka2: Apache Kafka $$KAFKA2_VERSION at $$KAFKA_BOOTSTRAP_SERVERS"; \
	$(GOMODS) test $(GOTESTFLAGS) -run '$(KAFKA2_TESTS)' -- $(KAFKA2_PKGS)
	scripts/dev-services down kafka2

## browser: headless Chromium for the console's real-browser test (cmd/kafkatx/console/browser_test.go):
## Debian's chromium package, apt-get installed once when missing (scripts/install-browser)
browser:
	scripts/install-browser >/dev/null

## services-up: start (or reuse) PostgreSQL and the Kafka broker; print their addresses
services-up:
	scripts/dev-services up
	@scripts/dev-services env postgres kafka

## services-down: stop what services-up started
services-down:
	scripts/dev-services down

services-status:
	scripts/dev-services status

## demo: the order service on PostgreSQL and an in-process Kafka broker (no JVM needed),
## on a fresh database each run; prints the summary and the tables
demo:
	scripts/demo $(DEMO_DATA)

## lint: static checks in every module (go vet and staticcheck, pinned), and every go.mod and
## go.sum as `go mod tidy` leaves them
lint:
	$(GOMODS) vet ./...
	$(GOMODS) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
	$(GOMODS) mod tidy -diff

## bench: kafkatx's throughput, latency and memory against the PostgreSQL ceiling for the same
## writes and a naive loop, and the whole pipeline (consume, apply, publish) as examples/orders
## runs it, in one run on this machine (docs/benchmarks.md). Not a CI test. Flags through
## BENCHFLAGS, e.g. BENCHFLAGS='-backlog 1000000 -cpuprofile-dir /tmp/prof' or
## BENCHFLAGS='-soak 10m -e2e-backlog 1000000 -scale 1,2,3' (run in examples/, its module).
.PHONY: bench
bench: services-up
	eval "$$(scripts/dev-services env)"; \
	$(GO) -C examples run ./internal/bench $(BENCHFLAGS)

## bench-peers: the figures to set beside the published Kafka -> PostgreSQL peers: examples/orders
## draining N orders (PEERS_N, default 3000000; dagtrigger DAGTRIGGER_N, default a tenth) without events,
## with the table outbox (plain and packed) and the WAL outbox, and dagtrigger against a stand-in
## Airflow (examples/internal/airflowstandin); one markdown table with msg/s,
## msg/s per core, row and message bytes, synchronous_commit, guarantees, duration and load
## (docs/benchmarks.md, "Set beside the published peers"). Not a CI test.
PEERS_N ?= 3000000
.PHONY: bench-peers
bench-peers: services-up
	eval "$$(scripts/dev-services env)"; \
	scripts/bench-peers $(PEERS_N)
