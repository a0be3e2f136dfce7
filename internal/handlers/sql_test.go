package handlers_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/handlers"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// shopFunction is a team's handler written in PL/pgSQL: it records every
// applied event (counting applications, so a double apply shows), creates
// orders, defers a payment until its order exists, refuses bad events with a
// permanent SQLSTATE and fails transiently twice on a flaky one.
const shopFunction = `
CREATE SCHEMA shop;
CREATE TABLE shop.applied (event_id text PRIMARY KEY, times int NOT NULL, payload bytea, headers jsonb);
CREATE TABLE shop.orders (order_id text PRIMARY KEY, paid boolean NOT NULL DEFAULT false);
CREATE FUNCTION shop.handle_event(event_id text, topic text, key text, event_type text,
                                  payload bytea, headers jsonb, attempt int) RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    released text[] := '{}';
BEGIN
    CASE event_type
    WHEN 'OrderCreated' THEN
        INSERT INTO shop.orders (order_id) VALUES (key);
        released := ARRAY['order:' || key];
    WHEN 'OrderPaid' THEN
        UPDATE shop.orders SET paid = true WHERE order_id = key;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'order % not created yet', key USING ERRCODE = 'PGRD1', DETAIL = 'order:' || key;
        END IF;
    WHEN 'Flaky' THEN
        IF attempt < 3 THEN
            RAISE EXCEPTION 'try again (attempt %)', attempt; -- P0001: transient
        END IF;
    WHEN 'Bad' THEN
        RAISE EXCEPTION 'cannot handle %', event_id USING ERRCODE = 'PGRP1';
    WHEN 'BadData' THEN
        PERFORM convert_from(payload, 'UTF8')::jsonb; -- class 22 on a non-JSON payload
    ELSE
        NULL;
    END CASE;
    INSERT INTO shop.applied (event_id, times, payload, headers) VALUES (event_id, 1, payload, headers)
    ON CONFLICT ON CONSTRAINT applied_pkey DO UPDATE SET times = shop.applied.times + 1;
    RETURN released;
END $$;`

func TestSQLHandlerOutcomes(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := pool.Exec(ctx, shopFunction)
	require.NoError(t, err)

	h, err := handlers.NewSQL(ctx, pool, "shop.handle_event")
	require.NoError(t, err)
	startWorker(t, pool, h)

	msg := func(id, typ, key string, payload string) pgrelay.Message {
		return pgrelay.Message{EventID: id, Topic: "orders", Key: key, EventType: typ, Payload: []byte(payload),
			Headers: map[string]string{"trace": id}}
	}
	// The payment arrives before its order: deferred, then released by the
	// order's handler (the deferral fallback is an hour: only the release can
	// wake it in time).
	receive(t, pool, msg("pay-1", "OrderPaid", "o1", `{}`))
	r := waitStatus(t, pool, "pay-1", "pending")
	require.Eventually(t, func() bool { return inboxRow(t, pool, "pay-1").WaitingFor == "order:o1" },
		10*time.Second, 20*time.Millisecond, "the payment is deferred on its order")
	require.Equal(t, "pending", r.Status)

	receive(t, pool, msg("create-1", "OrderCreated", "o1", `{}`),
		msg("flaky-1", "Flaky", "f", `{}`), msg("bad-1", "Bad", "b", `{}`),
		msg("baddata-1", "BadData", "d", "\xff\x00not json"))
	// Delivered again: the inbox stores each once.
	receive(t, pool, msg("create-1", "OrderCreated", "o1", `{}`), msg("pay-1", "OrderPaid", "o1", `{}`))

	waitStatus(t, pool, "create-1", "processed")
	waitStatus(t, pool, "pay-1", "processed")
	flaky := waitStatus(t, pool, "flaky-1", "processed")
	require.Equal(t, 3, flaky.Attempts, "transient errors are retried")
	bad := waitStatus(t, pool, "bad-1", "dead")
	require.Contains(t, bad.LastError, "permanent: shop.handle_event: SQLSTATE PGRP1: cannot handle bad-1")
	require.Equal(t, 1, bad.Attempts)
	badData := waitStatus(t, pool, "baddata-1", "dead")
	require.Contains(t, badData.LastError, "SQLSTATE 22")

	var paid bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT paid FROM shop.orders WHERE order_id = 'o1'`).Scan(&paid))
	require.True(t, paid)
	rows, err := pool.Query(ctx, `SELECT event_id, times FROM shop.applied ORDER BY event_id`)
	require.NoError(t, err)
	applied := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		require.NoError(t, rows.Scan(&id, &n))
		applied[id] = n
	}
	require.NoError(t, rows.Err())
	require.Equal(t, map[string]int{"create-1": 1, "pay-1": 1, "flaky-1": 1}, applied,
		"each event's writes committed exactly once; failed attempts left nothing")
	var headers string
	require.NoError(t, pool.QueryRow(ctx, `SELECT headers->>'trace' FROM shop.applied WHERE event_id = 'pay-1'`).Scan(&headers))
	require.Equal(t, "pay-1", headers, "the function gets the event's headers")
}

// TestSQLHandlerHeadersCarryKeySeq: the function's headers argument carries
// the event's per-key sequence as Pgrelay-Key-Seq (decimal) beside its own
// headers and content type; an event without a sequence has none, even when a
// header of its own uses that name.
func TestSQLHandlerHeadersCarryKeySeq(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := pool.Exec(ctx, shopFunction)
	require.NoError(t, err)
	h, err := handlers.NewSQL(ctx, pool, "shop.handle_event")
	require.NoError(t, err)
	startWorker(t, pool, h)

	receive(t, pool,
		pgrelay.Message{EventID: "seq-7", Topic: "orders", Key: "o7", KeySeq: 7, EventType: "Noted",
			Payload: []byte(`{}`), ContentType: "application/json", Headers: map[string]string{"trace": "t7"}},
		pgrelay.Message{EventID: "unsequenced", Topic: "orders", Key: "o8", EventType: "Noted",
			Payload: []byte(`{}`), Headers: map[string]string{"trace": "t8", "Pgrelay-Key-Seq": "99"}})
	waitStatus(t, pool, "seq-7", "processed")
	waitStatus(t, pool, "unsequenced", "processed")

	headers := func(id string) map[string]string {
		var m map[string]string
		require.NoError(t, pool.QueryRow(ctx, `SELECT headers FROM shop.applied WHERE event_id = $1`, id).Scan(&m))
		return m
	}
	require.Equal(t, map[string]string{"trace": "t7", "Pgrelay-Content-Type": "application/json", "Pgrelay-Key-Seq": "7"},
		headers("seq-7"))
	require.Equal(t, map[string]string{"trace": "t8"}, headers("unsequenced"))
}

func TestSQLHandlerFunctionMustExist(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := handlers.NewSQL(ctx, pool, "shop.handle_event")
	require.ErrorContains(t, err, "no function shop.handle_event(text, text, text, text, bytea, jsonb, integer) in the database")
	_, err = handlers.NewSQL(ctx, pool, "shop.handle_event; DROP TABLE pgrelay.inbox")
	require.ErrorContains(t, err, "is not a function name")
	_, err = pool.Exec(ctx, `CREATE FUNCTION public.wrong(text, text, text, text, bytea, jsonb, integer) RETURNS int
		LANGUAGE sql AS 'SELECT 1'`)
	require.NoError(t, err)
	_, err = handlers.NewSQL(ctx, pool, "wrong")
	require.ErrorContains(t, err, "returns integer; it must return void or text[]")
}
