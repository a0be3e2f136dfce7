#!/usr/bin/env bash
# Builds the container images pgrelay's container tests and compose check run
# on, without a registry: every image is made here from Debian's packages and
# Go modules, FROM scratch or from an imported root filesystem. The names are
# settings (the same variables docker-compose.yml and the tests read); these
# defaults are deliberately not the official images' names.
#
#   PGRELAY_POSTGRES_IMAGE  PostgreSQL 15 from Debian bookworm (debootstrap)
#   PGRELAY_NATS_IMAGE      nats-server with JetStream, from go.mod's version
#   PGRELAY_RELAY_IMAGE     the relay, from this checkout
#   PGRELAY_CONSUMER_IMAGE  the consumer, from this checkout
#   PGRELAY_PROMETHEUS_IMAGE  Prometheus, Debian bookworm's prometheus package
#
# PostgreSQL's root filesystem, NATS and Prometheus are built only when their
# image is missing (the slow part, about a minute cold); the relay and consumer images
# are rebuilt every time from the current code (Go's and Docker's caches make
# an unchanged rebuild take seconds). debootstrap needs root.
set -euo pipefail
cd "$(dirname "$0")/../.."

: "${PGRELAY_POSTGRES_IMAGE:=pgrelay-local/postgres:15-bookworm}"
: "${PGRELAY_NATS_IMAGE:=pgrelay-local/nats:$(go list -m -f '{{.Version}}' github.com/nats-io/nats-server/v2)}"
: "${PGRELAY_RELAY_IMAGE:=pgrelay-local/relay:dev}"
: "${PGRELAY_CONSUMER_IMAGE:=pgrelay-local/consumer:dev}"
: "${PGRELAY_PROMETHEUS_IMAGE:=pgrelay-local/prometheus:2-bookworm}"
: "${PGRELAY_DEBIAN_MIRROR:=http://deb.debian.org/debian}"
rootfs_image="${PGRELAY_POSTGRES_IMAGE%:*}-rootfs:${PGRELAY_POSTGRES_IMAGE##*:}"

# The classic builder: FROM scratch and a local base need nothing else.
export DOCKER_BUILDKIT=0

log() { printf 'images: %s\n' "$*"; }
# docker build's output only when it fails (the classic builder's deprecation
# notice is noise).
build() { docker build -q "$@" >"$work/build.log" 2>&1 || { cat "$work/build.log" >&2; return 1; }; }
have() { docker image inspect "$1" >/dev/null 2>&1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/pgrelay-images.XXXXXX")
trap 'rm -rf "$work"' EXIT

for name in PGRELAY_POSTGRES_IMAGE PGRELAY_NATS_IMAGE PGRELAY_RELAY_IMAGE PGRELAY_CONSUMER_IMAGE PGRELAY_PROMETHEUS_IMAGE; do
	case "${!name}" in
	postgres:* | nats:* | prom/* | library/* | docker.io/*)
		echo "images: $name=${!name} is an official image's name; choose a local one" >&2
		exit 1
		;;
	esac
done

# Debian's busybox-static, for a wget in the NATS image.
busybox() {
	(cd "$work" && apt-get download -qq busybox-static >/dev/null 2>"$work/apt.log") || { cat "$work/apt.log" >&2; return 1; }
	dpkg-deb -x "$work"/busybox-static_*.deb "$work/busybox-root"
	cp "$work/busybox-root/bin/busybox" "$1"
}

start=$SECONDS
if ! have "$rootfs_image"; then
	log "debootstrap bookworm with postgresql-15 -> $rootfs_image"
	command -v debootstrap >/dev/null || { echo "images: debootstrap is not installed" >&2; exit 1; }
	root="$work/rootfs"
	debootstrap --variant=minbase --include=postgresql-15,ca-certificates bookworm "$root" "$PGRELAY_DEBIAN_MIRROR" \
		>"$work/debootstrap.log" 2>&1 || { tail -n 30 "$work/debootstrap.log" >&2; exit 1; }
	# The package's default cluster and what an image does not need.
	rm -rf "$root"/var/lib/postgresql/15 "$root"/etc/postgresql/15 "$root"/usr/share/doc "$root"/usr/share/man \
		"$root"/usr/share/locale "$root"/usr/share/info "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
	tar -C "$root" -c . | docker import - "$rootfs_image" >/dev/null
	rm -rf "$root"
	log "$rootfs_image imported ($((SECONDS - start)) s)"
fi
log "PostgreSQL -> $PGRELAY_POSTGRES_IMAGE"
build --build-arg "BASE=$rootfs_image" -t "$PGRELAY_POSTGRES_IMAGE" deploy/images/postgres

if ! have "$PGRELAY_NATS_IMAGE"; then
	log "nats-server -> $PGRELAY_NATS_IMAGE"
	mkdir -p "$work/nats"
	cp deploy/images/nats/Dockerfile "$work/nats/"
	CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$work/nats/nats-server" github.com/nats-io/nats-server/v2
	busybox "$work/nats/busybox"
	build -t "$PGRELAY_NATS_IMAGE" "$work/nats"
fi

if ! have "$PGRELAY_PROMETHEUS_IMAGE"; then
	# Debian's binary is linked against glibc: it runs on the same Debian root
	# filesystem as PostgreSQL.
	log "prometheus (Debian's package) -> $PGRELAY_PROMETHEUS_IMAGE"
	mkdir -p "$work/prometheus"
	cp deploy/images/prometheus/Dockerfile "$work/prometheus/"
	(cd "$work" && apt-get download -qq prometheus >/dev/null 2>"$work/apt.log") || { cat "$work/apt.log" >&2; exit 1; }
	dpkg-deb -x "$work"/prometheus_*.deb "$work/prometheus-root"
	cp "$work/prometheus-root/usr/bin/prometheus" "$work/prometheus/"
	busybox "$work/prometheus/busybox"
	build --build-arg "BASE=$rootfs_image" -t "$PGRELAY_PROMETHEUS_IMAGE" "$work/prometheus"
fi

log "relay and consumer -> $PGRELAY_RELAY_IMAGE, $PGRELAY_CONSUMER_IMAGE"
CGO_ENABLED=0 go build -trimpath -tags grpcnotrace -ldflags='-s -w' -o "$work/bin/" ./cmd/relay ./cmd/consumer
for svc in relay consumer; do
	ctx="$work/$svc"
	mkdir -p "$ctx/bin" "$ctx/tmp"
	cp "$work/bin/$svc" "$ctx/bin/"
	cp /etc/ssl/certs/ca-certificates.crt "$ctx/" 2>/dev/null || : >"$ctx/ca-certificates.crt"
	printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$ctx/passwd"
	cat >"$ctx/Dockerfile" <<-DOCKERFILE
		# The $svc as a static binary on an empty image, laid out like the
		# Dockerfile's distroless target (/usr/local/bin/$svc, user 65532).
		FROM scratch
		COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
		COPY passwd /etc/passwd
		COPY tmp /tmp
		COPY bin/$svc /usr/local/bin/$svc
		USER 65532:65532
		ENTRYPOINT ["/usr/local/bin/$svc"]
		CMD ["run"]
	DOCKERFILE
	image=PGRELAY_RELAY_IMAGE
	[ "$svc" = consumer ] && image=PGRELAY_CONSUMER_IMAGE
	build -t "${!image}" "$ctx"
done
log "done in $((SECONDS - start)) s"
