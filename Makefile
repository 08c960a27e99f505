# kafkatx — development targets. `make test` is what CI runs (.ci/run).
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c

GO ?= go
# -race costs a slower first build (cgo, librdkafka) and ~2x test time; kept while the suite
# stays well inside CI's budget on 2 cores.
GOTESTFLAGS ?= -race -count=1 -timeout 30m
PKGS ?= ./...
# Orders for the demo; ../shared/ sits beside the clone.
DEMO_DATA ?= ../shared/data/orders.jsonl

.PHONY: test services-up services-down services-status demo lint

## test: start PostgreSQL, a real Apache Kafka broker and Kafka Connect with Debezium
## (scripts/dev-services up connect), then run every test
test: services-up
	scripts/dev-services up connect
	eval "$$(scripts/dev-services env)"; \
	export CI="$${CI:-true}"; \
	$(GO) test $(GOTESTFLAGS) $(PKGS)

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
## writes and a naive loop, in one run on this machine (docs/benchmarks.md). Not a CI test.
## Flags through BENCHFLAGS, e.g. BENCHFLAGS='-backlog 1000000 -cpuprofile-dir /tmp/prof'.
.PHONY: bench
bench: services-up
	eval "$$(scripts/dev-services env)"; \
	$(GO) run ./internal/bench $(BENCHFLAGS)
