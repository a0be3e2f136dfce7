#!/bin/sh
# wal-rescan.sh WAL_DIR START_LSN END_LSN
#
# The recovery of a lost WAL-capture slot (docs/wal.md#a-lost-slot): reads the
# WAL segments in WAL_DIR (the WAL archive) from START_LSN (the lost slot's
# confirmed_flush_lsn) to END_LSN (the new slot's confirmed_flush_lsn) with
# pg_waldump, and prints SQL that re-emits, in commit order, every pgrelay
# event of the transactions that committed in that window: one transaction
# per original transaction, each event re-written as it was
# (pg_logical_emit_message(true, 'pgrelay', <the same content>)), so its
# event id is kept and a repeat is absorbed by the broker's duplicate window
# and the inbox. Events of transactions that rolled back are left out.
#
#   sh deploy/wal-rescan.sh /archive 0/1A0B2C8 0/3000110 | psql -v ON_ERROR_STOP=1 -d mydb
#
# PG_WALDUMP names the pg_waldump binary (default: pg_waldump on PATH).
# Two-phase commits (PREPARE TRANSACTION) are not handled.
set -eu
if [ $# -ne 3 ]; then
	echo "usage: $0 WAL_DIR START_LSN END_LSN" >&2
	exit 2
fi
"${PG_WALDUMP:-pg_waldump}" --path="$1" --start="$2" --end="$3" | awk '
function xid(line,    m) {
	if (match(line, /tx: +[0-9]+/)) { m = substr(line, RSTART, RLENGTH); sub(/tx: +/, "", m); return m }
	return ""
}
/rmgr: LogicalMessage/ && /desc: MESSAGE transactional, prefix "pgrelay";/ {
	hex = $0
	sub(/.*bytes\): /, "", hex)
	gsub(/ /, "", hex)
	n++
	mtx[n] = xid($0)
	msql[n] = "SELECT pg_logical_emit_message(true, '\''pgrelay'\'', '\''\\x" tolower(hex) "'\''::bytea);"
	next
}
/rmgr: Transaction/ && /desc: COMMIT / {
	delete in_tx
	in_tx[xid($0)] = 1
	if (match($0, /subxacts: [0-9 ]+/)) {
		k = split(substr($0, RSTART + 10, RLENGTH - 10), subs, " ")
		for (j = 1; j <= k; j++) in_tx[subs[j]] = 1
	}
	out = ""
	for (i = 1; i <= n; i++) if ((mtx[i] in in_tx) && !(i in done)) { out = out msql[i] "\n"; done[i] = 1 }
	if (out != "") { printf "BEGIN;\n%sCOMMIT;\n", out; txs++ }
	next
}
END { printf "-- %d committed transaction(s) re-emitted\n", txs }
'
