# pgrelay — make targets. `make test` is the test command CI runs.
SHELL := /bin/bash
GO    ?= go
export TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable
export DATABASE_URL      ?= postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable

## MODULES: the library's module (the root) and the modules that require it
## through `replace github.com/pgrelay/pgrelay => ../` (docs/architecture.md,
## "Modules and dependencies"): the integration suite, the fault suite, the
## benchmark and the Helm chart's test (deploy/helm: helm lint, the chart
## rendered and checked against the binaries' flags; no cluster). unit, lint
## and tidy-check run in each.
MODULES := . integration integration/chaos bench deploy/helm

.PHONY: test check unit generate lint fmt tidy-check sqlc-check build size-check containers compose-check images

## The binaries are built as the Dockerfile builds them. grpcnotrace keeps
## grpc (the OTLP/gRPC trace exporter) from linking golang.org/x/net/trace,
## whose html/template pages would turn off the linker's dead-code
## elimination of methods (see docs/architecture.md, "Binary size").
BUILD_TAGS    := grpcnotrace
BUILD_FLAGS   := -trimpath -tags $(BUILD_TAGS)
LDFLAGS       := -s -w
MAX_BIN_BYTES := 40000000

## test: every check CI runs, then the whole suite with the race detector,
## the container path (testcontainers) and the docker compose check.
test: check fuzz unit rabbitmq-restart containers compose-check

## unit: go test -race over every package of every module (needs PostgreSQL,
## see README).
unit:
	@set -e; for m in $(MODULES); do echo "go test ./... ($$m)"; \
		$(GO) -C $$m test -race -count=1 -timeout 30m ./...; done

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
		$(GO) -C integration test -race -count=1 -v -timeout 15m -run '$(CONTAINER_TESTS)' .

## compose-check: docker-compose.yml end to end (deploy/compose-check.sh):
## every health check, an outbox row written with psql reaches the ledger,
## /metrics scraped, then down -v. Skipped without Docker, fails under CI.
compose-check:
	bash deploy/compose-check.sh

## images: build the local images (deploy/images/build.sh; needs root and
## debootstrap the first time) that .ci/run uses where no registry serves any.
images:
	bash deploy/images/build.sh

## check: formatting, vet, staticcheck, generated code, go.mod up to date and
## the binaries' size.
check: fmt lint sqlc-check tidy-check size-check

fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

## lint: go vet and staticcheck in every module; staticcheck is the root
## module's tool (go.mod's tool directive), run by path in the others.
lint:
	@set -e; staticcheck=$$($(GO) tool -n staticcheck); for m in $(MODULES); do \
		echo "go vet, staticcheck ./... ($$m)"; $(GO) -C $$m vet ./...; (cd $$m && $$staticcheck ./...); done

## generate: regenerate internal/db from queries/*.sql, migrations/ and the
## example schema (internal/ledger/migrations).
generate:
	$(GO) tool sqlc generate

sqlc-check:
	$(GO) tool sqlc diff

## tidy-check: go mod tidy changes no module's go.mod or go.sum.
tidy-check:
	@bak=$$(mktemp -d /tmp/pgrelay-tidy.XXXXXX); status=0; for m in $(MODULES); do \
		mkdir -p "$$bak/$$m"; cp $$m/go.mod $$m/go.sum "$$bak/$$m/"; \
		$(GO) -C $$m mod tidy || status=1; \
		if ! git diff --quiet -- $$m/go.mod $$m/go.sum; then \
			echo "go mod tidy changed $$m/go.mod or go.sum:"; git --no-pager diff -- $$m/go.mod $$m/go.sum; \
			cp "$$bak/$$m/go.mod" "$$bak/$$m/go.sum" $$m/; status=1; fi; \
	done; rm -rf "$$bak"; exit $$status

build:
	$(GO) build -tags $(BUILD_TAGS) -o bin/ ./cmd/...

## size-check: relay and consumer, built as shipped, are at most
## MAX_BIN_BYTES each; neither links golang.org/x/net/trace nor anything
## that calls reflect's Method/MethodByName (the linker's -dumpdep marks
## such a function <ReflectMethod>; one keeps every exported method of every
## reachable type, about a sixth of a binary).
size-check:
	@set -e; out=$$(mktemp -d); trap 'rm -rf "$$out"' EXIT; \
	if CGO_ENABLED=0 $(GO) list -deps -tags $(BUILD_TAGS) ./cmd/relay ./cmd/consumer | grep -qx 'golang.org/x/net/trace'; then \
		echo "size-check: golang.org/x/net/trace is linked:"; \
		CGO_ENABLED=0 $(GO) list -deps -tags $(BUILD_TAGS) -f '{{.ImportPath}}: {{join .Imports " "}}' ./cmd/relay ./cmd/consumer | grep -w 'golang.org/x/net/trace'; exit 1; fi; \
	for cmd in relay consumer; do \
		CGO_ENABLED=0 $(GO) build $(BUILD_FLAGS) -ldflags="$(LDFLAGS) -dumpdep" -o "$$out/$$cmd" ./cmd/$$cmd > "$$out/$$cmd.dep" 2>&1 || { tail -20 "$$out/$$cmd.dep"; exit 1; }; \
		size=$$(stat -c %s "$$out/$$cmd"); echo "$$cmd: $$size bytes (at most $(MAX_BIN_BYTES))"; \
		if grep -q '<ReflectMethod>' "$$out/$$cmd.dep"; then \
			echo "size-check: $$cmd reaches reflect Method/MethodByName (dead-code elimination of methods is off):"; \
			grep '<ReflectMethod>' "$$out/$$cmd.dep" | head -5; exit 1; fi; \
		if [ "$$size" -gt $(MAX_BIN_BYTES) ]; then echo "size-check: $$cmd is over $(MAX_BIN_BYTES) bytes"; exit 1; fi; \
	done

## bench: the full benchmark (about ten minutes): floors, relay, inbox, end to
## end, scale and cost; table on stdout, JSON/SVG in bench-results/. The
## benchmark is the module bench/ (run from there; results at the root).
.PHONY: bench bench-quick
BENCH_NATS_URL ?= nats://127.0.0.1:4222
bench:
	$(GO) -C bench run . -nats-url "$(BENCH_NATS_URL)" -out "$(CURDIR)/bench-results"

## bench-quick: a small run that only proves the benchmark works (well under 2 minutes).
bench-quick:
	$(GO) -C bench run . -quick -nats-url "$(BENCH_NATS_URL)" -out "$(CURDIR)/bench-results"

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
## PostgreSQL as the broker: one shorter run each; about five minutes), then TestChaosManyDatabases (three
## relays over many databases, about two minutes); `make chaos DURATION=20m` runs one long
## run, SEED=n replays one, BROKER=nats|rabbitmq|postgres picks the broker of every run
## (BROKER=rabbitmq also restarts RabbitMQ with rabbitmqctl; AMQP_URL, default
## the local server). The suite is the module integration/chaos.
DURATION ?=
SEED     ?=
BROKER   ?=
chaos:
	$(GO) -C integration/chaos test -count=1 -v -timeout $(if $(DURATION),3h,20m) -run '^(TestChaos|TestChaosManyDatabases)$$' . \
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
