package pgrelay_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// TestEmitValidatesAndTouchesNoTable: Emit refuses what Enqueue refuses,
// before writing anything, and writes no outbox row; pgrelay.emit refuses an
// invalid topic. (Decoding the messages is the WAL relay's tests' part, on a
// cluster with wal_level = logical.)
func TestEmitValidatesAndTouchesNoTable(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return pgrelay.Emit(ctx, tx, pgrelay.Message{Topic: "orders", Payload: []byte("1")}, pgrelay.Message{Payload: []byte("2")})
	})
	require.ErrorIs(t, err, pgrelay.ErrMissingTopic)
	require.ErrorContains(t, err, "message 1")

	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return pgrelay.Emit(ctx, tx, pgrelay.Message{Topic: "orders", Key: "k", Payload: []byte("1")})
	}))
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.outbox`).Scan(&n))
	require.Zero(t, n)

	var id string
	require.NoError(t, pool.QueryRow(ctx, `SELECT pgrelay.emit('orders', '\x01'::bytea)`).Scan(&id))
	require.Len(t, id, 36, "a random UUID")
	_, err = pool.Exec(ctx, `SELECT pgrelay.emit('orders.*', '\x01'::bytea)`)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "22023", pgErr.Code)
}

// TestSQLEmitRefusesWhatTheRelayCannotPublish: pgrelay.emit raises
// invalid_parameter_value at the call, naming the field, for every event the
// relay would refuse to read or Enqueue refuses (the call's statement, and
// what it emitted, is rolled back); the same event made valid is emitted.
func TestSQLEmitRefusesWhatTheRelayCannotPublish(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, c := range []struct{ args, want string }{
		{`headers => '{"X-Attempt": 1}'`, `header 'X-Attempt': headers must be a JSON object of strings`},
		{`headers => '{"X-Gone": null}'`, `header 'X-Gone': headers must be a JSON object of strings`},
		{`headers => '["a"]'`, `headers must be a JSON object of strings`},
		{`headers => '{"X Trace": "a"}'`, `header 'X Trace': the name must be`},
		{`headers => jsonb_build_object('X', E'a\r\nInjected: 1')`, `header 'X': the value contains a line break`},
		{`content_type => 'text/plain', headers => '{"Pgrelay-Content-Type": "text/plain"}'`, `header 'Pgrelay-Content-Type': set both as content_type and as a header`},
		{`topic => 'orders.*'`, `topic 'orders.*' is invalid`},
		{`event_id => E'e\x01'`, `event_id contains control characters`},
		{`event_id => repeat('e', 256)`, `event_id is longer than 255 bytes`},
		{`key => repeat('k', 1025)`, `key is longer than 1024 bytes`},
		{`key => E'k\n1'`, `key contains a line break`},
		{`event_type => E'Paid\r'`, `event_type contains a line break`},
		{`content_type => E'text/plain\n'`, `content_type contains a line break`},
		{`occurred_at => 'infinity'`, `occurred_at is out of range`},
		{`occurred_at => '10000-01-01 00:00:00+00'`, `occurred_at is out of range`},
		{`occurred_at => '0001-01-01 00:00:00+00'`, `occurred_at is out of range`},
	} {
		topic := `topic => 'orders', `
		if strings.HasPrefix(c.args, "topic") {
			topic = ""
		}
		_, err := pool.Exec(ctx, `SELECT pgrelay.emit(`+topic+`payload => '\x01', `+c.args+`)`)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, c.args)
		require.Equal(t, "22023", pgErr.Code, c.args)
		require.Contains(t, pgErr.Message, "pgrelay.emit: "+c.want, c.args)
	}
	var id string
	require.NoError(t, pool.QueryRow(ctx, `SELECT pgrelay.emit('orders', '\x01', key => 'k', event_type => 'Paid', event_id => 'e1',
		headers => '{"X-Attempt": "1", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}',
		content_type => 'text/plain', occurred_at => '9999-12-31 23:59:59.999999+00')`).Scan(&id))
	require.Equal(t, "e1", id)
}

// TestSQLEmitRunsNoCallerCodeAsItsOwner: pgrelay.emit and pgrelay.emit_wal
// run as their owner (SECURITY DEFINER); a producer allowed to call them
// who shadows the type names their bodies use with temporary domains whose
// CHECK calls its own function gets that function run as itself, never as
// the owner.
func TestSQLEmitRunsNoCallerCodeAsItsOwner(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	role := fmt.Sprintf("producer_%d", time.Now().UnixNano())
	_, err := pool.Exec(ctx, fmt.Sprintf(`CREATE ROLE %[1]s LOGIN; GRANT USAGE ON SCHEMA pgrelay TO %[1]s;
		GRANT EXECUTE ON FUNCTION pgrelay.emit(text, bytea, text, text, jsonb, text, text, timestamptz), pgrelay.emit_wal(bytea[]) TO %[1]s`, role))
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = pool.Exec(ctx, fmt.Sprintf(`DROP OWNED BY %[1]s; DROP ROLE %[1]s`, role))
	})
	cfg := pool.Config().ConnConfig.Copy()
	cfg.User = role
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `CREATE FUNCTION pg_temp.seen(v pg_catalog.text) RETURNS pg_catalog.bool LANGUAGE sql
		AS $$ SELECT pg_catalog.set_config('test.ran_as', pg_catalog.concat_ws(',', pg_catalog.current_setting('test.ran_as', true), current_user), false) IS NOT NULL $$`)
	require.NoError(t, err)
	for _, typ := range []string{"text", "jsonb", "bytea", "timestamptz", "int4", "bool"} {
		_, err := conn.Exec(ctx, `CREATE DOMAIN pg_temp.`+typ+` AS pg_catalog.`+typ+` CHECK (pg_temp.seen(VALUE::pg_catalog.text))`)
		require.NoError(t, err, typ)
	}
	_, err = conn.Exec(ctx, `SELECT 'shadowed'::text`) // the shadow works in the caller's own statements
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `SELECT pgrelay.emit('orders', '\x01', key => 'k', headers => '{"X": "y"}')`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `SELECT pgrelay.emit_wal(ARRAY['\x01'::pg_catalog.bytea])`)
	require.NoError(t, err)
	var ranAs string
	require.NoError(t, conn.QueryRow(ctx, `SELECT coalesce(pg_catalog.current_setting('test.ran_as', true), '')::pg_catalog.text`).Scan(&ranAs))
	require.Equal(t, role, ranAs, "the caller's code ran as the functions' owner")
}
