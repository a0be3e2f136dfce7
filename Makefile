# pgrelay — make targets. `make test` is the test command CI runs.
SHELL := /bin/bash
GO    ?= go
export TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable
export DATABASE_URL      ?= postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable

.PHONY: test check unit generate lint fmt tidy-check sqlc-check build containers compose-check images

## test: every check CI runs, then the whole suite with the race detector,
## the container path (testcontainers) and the docker compose check.
test: check fuzz unit rabbitmq-restart containers compose-check

## unit: go test -race over every package (needs PostgreSQL, see README).
unit:
	$(GO) test -race -count=1 -timeout 30m ./...

## rabbitmq-restart: the RabbitMQ tests that restart the server (rabbitmqctl
## stop_app / start_app) or change its max_message_size, run alone so that no
## other test shares the server meanwhile (skipped in unit). Needs rabbitmqctl
## controlling the server at AMQP_URL (default the local one).
.PHONY: rabbitmq-restart
rabbitmq-restart:
	PGRELAY_RABBITMQ_RESTART=1 $(GO) test -race -count=1 -v -run '^(TestConformance|TestServerMaxMessageSizeIsPermanent)$$' ./broker/rabbitmq/

## containers: the integration tests a user with Docker and no services runs:
## TEST_DATABASE_URL and NATS_URL unset, so testcontainers-go starts PostgreSQL
## (its postgres module, image PGRELAY_POSTGRES_IMAGE, default postgres:16-alpine)
## and NATS (a generic container, PGRELAY_NATS_IMAGE, default nats:2.11-alpine).
## Without Docker the tests are skipped, or fail under CI.
CONTAINER_TESTS := ^(TestContainers|TestEndToEnd|TestMalformedInputGoesDead)$$
containers:
	env -u TEST_DATABASE_URL -u NATS_URL PGRELAY_CONTAINER_TESTS=1 \
		$(GO) test -race -count=1 -v -timeout 15m -run '$(CONTAINER_TESTS)' ./integration/

## compose-check: docker-compose.yml end to end (deploy/compose-check.sh):
## every health check, an outbox row written with psql reaches the ledger,
## /metrics scraped, then down -v. Skipped without Docker, fails under CI.
compose-check:
	bash deploy/compose-check.sh

## images: build the local images (deploy/images/build.sh; needs root and
## debootstrap the first time) that .ci/run uses where no registry serves any.
images:
	bash deploy/images/build.sh

## check: formatting, vet, staticcheck, generated code and go.mod up to date.
check: fmt lint sqlc-check tidy-check

fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

lint:
	$(GO) vet ./...
	$(GO) tool staticcheck ./...

## generate: regenerate internal/db from queries/*.sql, migrations/ and the
## example schema (internal/ledger/migrations).
generate:
	$(GO) tool sqlc generate

sqlc-check:
	$(GO) tool sqlc diff

tidy-check:
	@cp go.mod /tmp/pgrelay-go.mod.bak; cp go.sum /tmp/pgrelay-go.sum.bak; \
	$(GO) mod tidy; \
	if ! git diff --quiet -- go.mod go.sum; then \
		echo "go mod tidy changed go.mod/go.sum:"; git --no-pager diff -- go.mod go.sum; \
		cp /tmp/pgrelay-go.mod.bak go.mod; cp /tmp/pgrelay-go.sum.bak go.sum; exit 1; fi

build:
	$(GO) build -o bin/ ./cmd/...

## bench: the full benchmark (about ten minutes): floors, relay, inbox, end to
## end, scale and cost; table on stdout, JSON/SVG in bench-results/.
.PHONY: bench bench-quick
BENCH_NATS_URL ?= nats://127.0.0.1:4222
bench:
	$(GO) run ./bench -nats-url "$(BENCH_NATS_URL)" -out bench-results

## bench-quick: a small run that only proves the benchmark works (well under 2 minutes).
bench-quick:
	$(GO) run ./bench -quick -nats-url "$(BENCH_NATS_URL)" -out bench-results

.PHONY: demo demo-short
## demo: build the binaries and run the end-to-end demo with crashes, duplicates
## and poison, then verify the ledger (needs only PostgreSQL; NATS is embedded
## unless NATS_URL is set). BROKER=rabbitmq runs it on RabbitMQ (AMQP_URL,
## default the local server); BROKER=postgres with PostgreSQL as the broker;
## BROKER=kafka on kfake, an in-memory Kafka the demo starts. CAPTURE=wal runs
## the relay in WAL capture (producers Emit; wal_level = logical, or a private
## cluster the demo starts).
demo: build
	./bin/demo $(if $(BROKER),--broker $(BROKER)) $(if $(CAPTURE),--capture $(CAPTURE))

## demo-short: the quick demo CI runs.
demo-short: build
	./bin/demo --short

.PHONY: chaos fuzz
## chaos: the fault suite with its exactly-once checker (real relay and
## consumer processes, a private PostgreSQL cluster, a broker, toxiproxy
## links). Short by default (NATS: a fixed seed and a random one; RabbitMQ and
## PostgreSQL as the broker: one shorter run each; about five minutes); `make chaos DURATION=20m` runs one long
## run, SEED=n replays one, BROKER=nats|rabbitmq|postgres picks the broker of every run
## (BROKER=rabbitmq also restarts RabbitMQ with rabbitmqctl; AMQP_URL, default
## the local server).
DURATION ?=
SEED     ?=
BROKER   ?=
chaos:
	$(GO) test -count=1 -v -timeout $(if $(DURATION),3h,20m) -run '^TestChaos$$' ./integration/chaos/ \
		$(if $(DURATION),-chaos.duration=$(DURATION)) $(if $(SEED),-chaos.seed=$(SEED)) $(if $(BROKER),-chaos.broker=$(BROKER))

## fuzz: a bounded run of every fuzz target over untrusted input (their seed
## corpora also run as ordinary tests in unit); FUZZTIME per target. A count
## of executions, not a duration: with a duration, Go 1.26's fuzz coordinator
## can report "context deadline exceeded" as a failure when the time is up
## (golang/go#75804, fixed in Go 1.27), which failed a CI run with no input
## at fault.
FUZZTIME ?= 20000x
FUZZ_TARGETS := FuzzDecode:./broker/nats FuzzNATSRoundTrip:./broker/nats FuzzRabbitMQRoundTrip:./broker/rabbitmq FuzzKafkaRoundTrip:./broker/kafka \
	FuzzValidateEventID:./internal/event \
	FuzzDecodePayload:./internal/ledger FuzzEnv:./internal/cli FuzzNewLogger:./internal/cli \
	FuzzToNATS:./broker/nats FuzzValidate:. \
	FuzzFingerprint:./httpidem FuzzParseKey:./httpidem \
	FuzzKeyStrategy:. FuzzCanonicalJSON:.
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		echo "fuzz $${t%%:*} ($${t#*:}, $(FUZZTIME))"; \
		$(GO) test -run '^$$' -fuzz "^$${t%%:*}\$$" -fuzztime $(FUZZTIME) "$${t#*:}" > /tmp/pgrelay-fuzz.log 2>&1 || { cat /tmp/pgrelay-fuzz.log; exit 1; }; \
	done
