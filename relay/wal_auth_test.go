package relay

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/walmsg"
)

// TestWALPublishesOnlyAllowedProducers: a role with no privilege on schema
// pgrelay writes well-formed events with pg_logical_emit_message (which any
// role may call): unsigned, signed with a made-up key, with an unknown key
// id, and a genuinely signed event with its content altered. None is
// published, each is counted by reason, and the slot confirms past them. A
// role granted EXECUTE on pgrelay.emit and pgrelay.emit_wal publishes with
// pgrelay.Emit and pgrelay.emit, also after the key is rotated. Messages
// with the consumer's flush prefix or the heartbeat's prefix are never
// events.
func TestWALPublishesOnlyAllowedProducers(t *testing.T) {
	b, c := walSetup(t, walConf)
	ch := b.subscribe(t)
	rec := &walStatusRecorder{}
	cfg := b.walConfig(t, b.publisher(t), nil)
	cfg.walObs = rec
	r, _ := start(t, cfg)
	waitReading(t, r)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := b.pool.Exec(ctx, `CREATE ROLE forger LOGIN; CREATE ROLE producer LOGIN;
		GRANT USAGE ON SCHEMA pgrelay TO producer;
		GRANT EXECUTE ON FUNCTION pgrelay.emit(text, bytea, text, text, jsonb, text, text, timestamptz), pgrelay.emit_wal(bytea[]) TO producer`)
	require.NoError(t, err)
	as := func(role string) *pgxpool.Pool {
		pool, err := pgxpool.New(ctx, strings.Replace(c.URL(), "postgres@", role+"@", 1))
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		return pool
	}
	forger, producer := as("forger"), as("producer")

	body := func(id string) []byte {
		b, err := walmsg.Encode(walmsg.Event{EventID: id, Topic: "payments", Key: "acct-1", EventType: "PaymentReceived",
			OccurredAt: time.Now().UTC(), Payload: []byte(`{"amount":1000000}`)})
		require.NoError(t, err)
		return b
	}
	var kid int32
	var secret []byte
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT id, secret FROM pgrelay.wal_keys ORDER BY id DESC LIMIT 1`).Scan(&kid, &secret))
	altered := walmsg.Sign(body("forged-altered"), kid, secret)
	require.Contains(t, string(altered), `"key":"acct-1"`)
	altered = []byte(strings.Replace(string(altered), `"key":"acct-1"`, `"key":"acct-2"`, 1))
	for _, content := range [][]byte{
		body("forged-unsigned"),
		walmsg.Sign(body("forged-wrong-key"), kid, []byte("a key the forger made up")),
		walmsg.Sign(body("forged-unknown-key"), kid+100, secret),
		altered,
	} {
		_, err := forger.Exec(ctx, `SELECT pg_logical_emit_message(true, 'pgrelay', $1::bytea)`, content)
		require.NoError(t, err, "pg_logical_emit_message is executable by PUBLIC")
	}
	for _, prefix := range []string{walmsg.HeartbeatPrefix, "pgrelay.consumer.flush"} {
		_, err := forger.Exec(ctx, `SELECT pg_logical_emit_message(true, $1, $2::bytea)`, prefix, walmsg.Sign(body("forged-"+prefix), kid, secret))
		require.NoError(t, err)
	}
	// The functions that sign are not the forger's to call.
	_, err = forger.Exec(ctx, `SELECT pgrelay.emit_wal(ARRAY[$1::bytea])`, body("forged-through-emit_wal"))
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "42501", pgErr.Code, "permission denied")
	_, err = forger.Exec(ctx, `SELECT pgrelay.emit('payments', '\x01', event_id => 'forged-through-emit')`)
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "42501", pgErr.Code)

	// The allowed producer, with Emit and with pgrelay.emit.
	o, err := pgrelay.NewOutbox(pgrelay.OutboxConfig{})
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, producer, func(tx pgx.Tx) error {
		return o.Emit(ctx, tx, pgrelay.Message{EventID: "allowed-1", Topic: "payments", Key: "acct-1", EventType: "PaymentReceived", Payload: []byte("1")})
	}))
	_, err = producer.Exec(ctx, `SELECT pgrelay.emit('payments', convert_to('2', 'UTF8'), key => 'acct-1', event_id => 'allowed-2')`)
	require.NoError(t, err)

	// Committed before the allowed events, the forged ones were read (and
	// rejected) before them: nothing but the allowed events reaches the
	// stream.
	got := readAll(t, ch, 2, 20*time.Second)
	for i, m := range got {
		require.Equal(t, fmt.Sprintf("allowed-%d", i+1), m.eventID)
		require.Equal(t, fmt.Sprint(i+1), string(m.data))
	}
	require.Equal(t, map[string]int{"unsigned": 1, "bad_signature": 2, "unknown_key": 1}, rec.rejections())

	// A key added while the relay streams signs the next events: the relay
	// reads the keys again and publishes them.
	var newKid int32
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT pgrelay.wal_rotate_key()`).Scan(&newKid))
	require.Equal(t, kid+1, newKid)
	_, err = producer.Exec(ctx, `SELECT pgrelay.emit('payments', convert_to('3', 'UTF8'), key => 'acct-1', event_id => 'allowed-3')`)
	require.NoError(t, err)
	require.Equal(t, "allowed-3", readAll(t, ch, 1, 20*time.Second)[0].eventID)
	require.Equal(t, map[string]int{"unsigned": 1, "bad_signature": 2, "unknown_key": 1}, rec.rejections(), "nothing more rejected")
	require.Eventually(t, func() bool {
		confirmed, current := b.slotConfirmed(t, DefaultWALSlot)
		return confirmed >= current-1024 // past the rejected messages, caught up to the heartbeats
	}, 10*time.Second, 50*time.Millisecond)
}

// TestWALRelayNeedsTheKeys: a relay whose role may not read pgrelay.wal_keys
// refuses to start, naming the table and the grant, rather than reject every
// event.
func TestWALRelayNeedsTheKeys(t *testing.T) {
	b, c := walSetup(t, walConf)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := b.pool.Exec(ctx, `CREATE ROLE relayer LOGIN REPLICATION; GRANT USAGE ON SCHEMA pgrelay TO relayer`)
	require.NoError(t, err)
	pool, err := pgxpool.New(ctx, strings.Replace(c.URL(), "postgres@", "relayer@", 1))
	require.NoError(t, err)
	defer pool.Close()
	cfg := b.walConfig(t, b.publisher(t), nil)
	cfg.Pool = pool
	r, err := newEngine(cfg)
	require.NoError(t, err)
	err = r.run(ctx)
	require.ErrorContains(t, err, "pgrelay.wal_keys; the relay's role needs SELECT on it")
	require.ErrorContains(t, err, "permission denied")
}
