#!/usr/bin/env bash
# The docker-compose.yml end-to-end check (`make compose-check`): brings the
# real compose file up under a project of its own, waits for every health
# check and for the one-shot migration, writes an outbox row with psql as the
# README shows, waits for its ledger row, scrapes the relay's and the
# consumer's /metrics, checks that Prometheus scrapes both (targets up) with
# the alert rules loaded, then takes the stack down with its volumes.
#
# Images: PGRELAY_POSTGRES_IMAGE, PGRELAY_NATS_IMAGE, PGRELAY_RELAY_IMAGE,
# PGRELAY_CONSUMER_IMAGE, PGRELAY_PROMETHEUS_IMAGE (when the relay and
# consumer images are named, they are used as they are; otherwise compose
# builds them from the Dockerfile). Published ports (127.0.0.1 only) default
# to 25432, 24222, 29090, 29091 and 29095 so that the check does not collide
# with a PostgreSQL, NATS or Prometheus already running.
# Without a Docker engine the check is skipped, except under CI, where it fails.
set -euo pipefail
cd "$(dirname "$0")/.."

export PGRELAY_POSTGRES_PORT="${PGRELAY_POSTGRES_PORT:-25432}"
export PGRELAY_NATS_PORT="${PGRELAY_NATS_PORT:-24222}"
export PGRELAY_RELAY_METRICS_PORT="${PGRELAY_RELAY_METRICS_PORT:-29090}"
export PGRELAY_CONSUMER_METRICS_PORT="${PGRELAY_CONSUMER_METRICS_PORT:-29091}"
export PGRELAY_PROMETHEUS_PORT="${PGRELAY_PROMETHEUS_PORT:-29095}"
timeout_s="${COMPOSE_CHECK_TIMEOUT:-240}"

log() { printf 'compose-check: %s\n' "$*"; }
die() { printf 'compose-check: FAIL: %s\n' "$*" >&2; exit 1; }

if ! docker info >/dev/null 2>&1; then
	msg="no Docker engine answers (docker info failed)"
	[ -n "${CI:-}" ] && die "$msg; under CI the compose check must run (.ci/run starts dockerd)"
	log "skipped: $msg"
	exit 0
fi
if docker compose version >/dev/null 2>&1; then
	compose=(docker compose)
elif command -v docker-compose >/dev/null 2>&1; then
	compose=(docker-compose)
else
	die "neither 'docker compose' nor docker-compose is installed"
fi
command -v jq >/dev/null 2>&1 || die "jq is not installed (the Prometheus checks read its API's JSON)"
for p in "$PGRELAY_POSTGRES_PORT" "$PGRELAY_NATS_PORT" "$PGRELAY_RELAY_METRICS_PORT" "$PGRELAY_CONSUMER_METRICS_PORT" "$PGRELAY_PROMETHEUS_PORT"; do
	if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
		die "port 127.0.0.1:$p is in use; choose others with PGRELAY_*_PORT"
	fi
done

project="pgrelay-check-$$"
dc() { "${compose[@]}" -p "$project" -f docker-compose.yml "$@"; }
build=--build
if [ -n "${PGRELAY_RELAY_IMAGE:-}" ] && [ -n "${PGRELAY_CONSUMER_IMAGE:-}" ]; then
	build=--no-build
fi
ok=
cleanup() {
	if [ -z "$ok" ]; then
		log "logs of the failed stack:"
		dc logs --no-color --tail 60 >&2 || true
	fi
	log "down -v"
	dc down -v --remove-orphans >/dev/null 2>&1 || log "down -v failed"
}
trap cleanup EXIT

start=$SECONDS
log "up ($project, ${compose[*]}, images: ${PGRELAY_POSTGRES_IMAGE:-postgres:16-alpine}, ${PGRELAY_NATS_IMAGE:-nats:2.11-alpine}, ${PGRELAY_RELAY_IMAGE:-built}, ${PGRELAY_CONSUMER_IMAGE:-built}, ${PGRELAY_PROMETHEUS_IMAGE:-prom/prometheus:v2.53.0})"
dc up -d "$build" >/dev/null 2>&1 || { dc up -d "$build" || true; die "compose up failed"; }

# Every service with a health check must become healthy; migrate must exit 0.
for svc in postgres nats relay consumer prometheus; do
	id=$(dc ps -q "$svc")
	[ -n "$id" ] || die "service $svc has no container"
	until [ "$(docker inspect -f '{{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}' "$id")" = healthy ]; do
		state=$(docker inspect -f '{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}' "$id")
		case "$state" in
		*" none") die "service $svc has no health check" ;;
		*" unhealthy") die "service $svc unhealthy: $(docker inspect -f '{{range .State.Health.Log}}{{.Output}}{{end}}' "$id" | tail -n 3)" ;;
		exited*) die "service $svc exited" ;;
		esac
		((SECONDS - start < timeout_s)) || die "service $svc not healthy after ${timeout_s}s ($state)"
		sleep 1
	done
	log "$svc healthy ($((SECONDS - start)) s)"
done
mid=$(dc ps -q migrate)
[ "$(docker inspect -f '{{.State.Status}} {{.State.ExitCode}}' "$mid")" = "exited 0" ] || die "migrate did not exit 0"
log "migrate exited 0"

db="postgres://postgres:postgres@127.0.0.1:$PGRELAY_POSTGRES_PORT/pgrelay"
order="o-compose-$$"
psql "$db" -v ON_ERROR_STOP=1 -q -c "INSERT INTO pgrelay.outbox (topic, key, event_type, payload)
  VALUES ('orders', '$order', 'OrderCreated', convert_to('{\"order_id\":\"$order\",\"customer_id\":\"c-1\",\"amount_cents\":1250,\"currency\":\"EUR\"}', 'UTF8'))"
log "outbox row for $order inserted with psql"
until [ "$(psql "$db" -XAtq -c "SELECT amount_cents FROM ledger_orders WHERE order_id = '$order'")" = 1250 ]; do
	((SECONDS - start < timeout_s)) || die "no ledger row for $order after ${timeout_s}s"
	sleep 0.5
done
log "ledger row for $order: 1250 cents ($((SECONDS - start)) s)"

metric() { # url name: the sum of the samples of a counter
	curl -fsS "$1" | awk -v n="$2" '$1 == n || index($1, n "{") == 1 { s += $2 } END { print s + 0 }'
}
published=$(metric "http://127.0.0.1:$PGRELAY_RELAY_METRICS_PORT/metrics" relay_published_total)
processed=$(metric "http://127.0.0.1:$PGRELAY_CONSUMER_METRICS_PORT/metrics" consumer_processed_total)
log "metrics: relay_published_total=$published consumer_processed_total=$processed"
awk -v p="$published" -v c="$processed" 'BEGIN { exit !(p >= 1 && c >= 1) }' || die "metrics do not show the event"
# Prometheus scrapes both services (every target up) and loaded the rules.
prom="http://127.0.0.1:$PGRELAY_PROMETHEUS_PORT"
targets() { curl -fsS "$prom/api/v1/targets?state=active" | jq -r '[.data.activeTargets[] | "\(.labels.job)=\(.health)"] | sort | join(" ")'; }
until [ "$(targets 2>/dev/null)" = "consumer=up relay=up" ]; do
	((SECONDS - start < timeout_s)) || die "Prometheus targets not up after ${timeout_s}s: $(targets 2>&1)"
	sleep 1
done
log "prometheus targets: $(targets)"
loaded=$(curl -fsS "$prom/api/v1/rules?type=alert" | jq '[.data.groups[].rules[]] | length')
expected=$(grep -c '^ *- alert: ' deploy/prometheus/alerts.yml)
[ "$loaded" = "$expected" ] || die "Prometheus loaded $loaded alert rules, deploy/prometheus/alerts.yml has $expected"
log "prometheus loaded $loaded alert rules"
ok=1
log "PASS in $((SECONDS - start)) s"
