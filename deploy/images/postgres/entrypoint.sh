#!/bin/sh
# Entrypoint of the PostgreSQL image built from Debian's packages
# (deploy/images/build.sh). It follows the official postgres image's contract:
#
#   POSTGRES_PASSWORD  the superuser's password (required, unless
#                      POSTGRES_HOST_AUTH_METHOD=trust)
#   POSTGRES_USER      the superuser (default postgres)
#   POSTGRES_DB        a database created at first start (default: the user)
#   /docker-entrypoint-initdb.d/*.sql, *.sh   run once, after initdb
#
# On an empty data directory it runs initdb, starts a temporary server that
# listens only on its Unix socket, creates POSTGRES_DB, runs the init scripts
# and stops it; then it starts the real server listening on every address.
# Like the official image, the log therefore says "database system is ready
# to accept connections" twice on a first start, once on a restart.
set -eu

if [ "$#" -eq 0 ] || [ "${1#-}" != "$1" ]; then
	set -- postgres "$@"
fi
if [ "$1" != postgres ]; then
	exec "$@"
fi

PGDATA=${PGDATA:-/var/lib/postgresql/data}
export PGDATA
POSTGRES_USER=${POSTGRES_USER:-postgres}
POSTGRES_DB=${POSTGRES_DB:-$POSTGRES_USER}
auth=${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}

if [ "$(id -u)" = 0 ]; then
	mkdir -p "$PGDATA" /var/run/postgresql
	chmod 700 "$PGDATA"
	chown -R postgres:postgres "$PGDATA" /var/run/postgresql
	exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi

if [ ! -s "$PGDATA/PG_VERSION" ]; then
	if [ -z "${POSTGRES_PASSWORD:-}" ] && [ "$auth" != trust ]; then
		echo "entrypoint: POSTGRES_PASSWORD is empty: set it (or POSTGRES_HOST_AUTH_METHOD=trust)" >&2
		exit 1
	fi
	pwfile=$(mktemp)
	printf '%s\n' "${POSTGRES_PASSWORD:-}" >"$pwfile"
	initdb --username="$POSTGRES_USER" --pwfile="$pwfile" --auth-local=trust --auth-host="$auth" \
		--encoding=UTF8 --locale=C.UTF-8 ${POSTGRES_INITDB_ARGS:-} >/dev/null
	rm -f "$pwfile"
	printf 'host all all all %s\n' "$auth" >>"$PGDATA/pg_hba.conf"

	pg_ctl -D "$PGDATA" -w -o "-c listen_addresses='' -c unix_socket_directories=/var/run/postgresql" start
	psql="psql -v ON_ERROR_STOP=1 -h /var/run/postgresql -U $POSTGRES_USER -X -q"
	if [ "$POSTGRES_DB" != postgres ]; then
		echo 'CREATE DATABASE :"db";' | $psql -d postgres -v db="$POSTGRES_DB"
	fi
	for f in /docker-entrypoint-initdb.d/*; do
		case "$f" in
		*.sql) echo "entrypoint: running $f"; $psql -d "$POSTGRES_DB" -f "$f" ;;
		*.sh) echo "entrypoint: running $f"; . "$f" ;;
		esac
	done
	pg_ctl -D "$PGDATA" -m fast -w stop
	echo "entrypoint: PostgreSQL init process complete; ready for start up."
fi

# The caller's own -c settings come last, so they win.
shift
exec postgres -c listen_addresses='*' -c unix_socket_directories=/var/run/postgresql "$@"
