package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The minimal pipeline is the cost group's floor at a fixed load: the same
// hops as the relay and the consumer (outbox → NATS JetStream → inbox and
// ledger credit), each done with the fewest round trips this shape allows
// and none of the guarantees. The benchmark runs it as two processes of its
// own binary (os.Args[1] names one), with the same producers, cluster,
// nats-server and CPU accounting as the binaries it measures.
//
//   - minimal-relay: one connection; every busyPoll it claims up to 100
//     pending rows and marks them published in one autocommit statement,
//     then publishes them (Nats-Msg-Id set) and awaits their
//     acknowledgements. No leases, no fencing, no per-key order, no
//     notifications: it polls whether or not rows came, marks before it
//     publishes (a crash loses the batch), and one relay only.
//   - minimal-consumer: a durable pull consumer; what arrived is stored and
//     credited in one autocommit statement (inbox insert, duplicates
//     skipped, and the ledger credits of the rows inserted), then each
//     message acknowledged. No retries, dead letters, ordering or apply
//     modes.
//
// So the floor's CPU per event is what the hops themselves cost on this
// machine at the load: what the products' guarantees add is the difference.
const (
	minimalRelayCmd    = "minimal-relay"
	minimalConsumerCmd = "minimal-consumer"
	// captureMinimal names the minimal pipeline among the cost group's
	// capture modes.
	captureMinimal = "minimal"
	// minimalPoll is how long the minimal relay waits between claims: the
	// relay's busy poll after a short read (relay busyPollCoalesce), so
	// that both coalesce alike at a moderate load.
	minimalPoll  = 4 * time.Millisecond
	minimalBatch = 100
)

const minimalClaim = `UPDATE pgrelay.outbox SET status = 'published', published_at = now(), attempts = attempts + 1
WHERE id IN (SELECT id FROM pgrelay.outbox WHERE status = 'pending' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)
RETURNING event_id, topic, event_type, payload`

const minimalStore = `WITH m AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::text[], $6::bigint[], $7::text[])
        AS m(event_id, topic, event_type, payload, order_id, amount_cents, currency)
), ins AS (
    INSERT INTO pgrelay.inbox (event_id, topic, key, event_type, payload, status, attempts, lock_version,
                               started_at, finished_at, dedup_key, fingerprint)
    SELECT event_id, topic, event_id, event_type, payload, 'processed', 1, 1, now(), now(), event_id, '\x00'::bytea FROM m
    ON CONFLICT DO NOTHING
    RETURNING event_id
)
INSERT INTO ledger_entries (event_id, order_id, customer_id, amount_cents, currency)
SELECT m.event_id, m.order_id, o.customer_id, m.amount_cents, m.currency
FROM m JOIN ins USING (event_id) JOIN ledger_orders o ON o.order_id = m.order_id`

// exitIfMinimal runs the minimal pipeline's process named by os.Args[1], if
// it names one, and exits with its outcome; it returns otherwise.
func exitIfMinimal() {
	ran, err := runMinimal()
	if !ran {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// runMinimal runs the minimal pipeline's process named by os.Args[1], if
// it names one; ran reports whether it did.
func runMinimal() (ran bool, err error) {
	if len(os.Args) < 2 || (os.Args[1] != minimalRelayCmd && os.Args[1] != minimalConsumerCmd) {
		return false, nil
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	env := func(name string) (string, error) {
		v := os.Getenv(name)
		if v == "" {
			return "", fmt.Errorf("%s: %s is not set", os.Args[1], name)
		}
		return v, nil
	}
	dbURL, err := env("DATABASE_URL")
	if err != nil {
		return true, err
	}
	natsURL, err := env("NATS_URL")
	if err != nil {
		return true, err
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, dbURL)
	if err != nil {
		return true, fmt.Errorf("%s: %w", os.Args[1], err)
	}
	defer conn.Close(context.Background())
	nc, err := nats.Connect(natsURL)
	if err != nil {
		return true, fmt.Errorf("%s: %w", os.Args[1], err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return true, err
	}
	if os.Args[1] == minimalRelayCmd {
		prefix, err := env("RELAY_SUBJECT_PREFIX")
		if err != nil {
			return true, err
		}
		return true, minimalRelay(ctx, conn, js, prefix)
	}
	stream, err := env("CONSUMER_STREAM")
	if err != nil {
		return true, err
	}
	prefix, err := env("CONSUMER_SUBJECT_PREFIX")
	if err != nil {
		return true, err
	}
	return true, minimalConsumer(ctx, conn, js, stream, prefix)
}

type minimalRow struct {
	eventID, topic, eventType string
	payload                   []byte
}

func minimalRelay(ctx context.Context, conn *pgx.Conn, js jetstream.JetStream, prefix string) error {
	acks := make([]jetstream.PubAckFuture, 0, minimalBatch)
	pause := time.NewTimer(minimalPoll)
	defer pause.Stop()
	for {
		qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		rows, err := conn.Query(qctx, minimalClaim, minimalBatch)
		if err != nil {
			cancel()
			return stopped(ctx, fmt.Errorf("minimal relay: claim: %w", err))
		}
		batch, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (minimalRow, error) {
			var m minimalRow
			err := r.Scan(&m.eventID, &m.topic, &m.eventType, &m.payload)
			return m, err
		})
		cancel()
		if err != nil {
			return stopped(ctx, fmt.Errorf("minimal relay: claim: %w", err))
		}
		acks = acks[:0]
		for _, r := range batch {
			msg := nats.NewMsg(prefix + "." + r.topic)
			msg.Header.Set(jetstream.MsgIDHeader, r.eventID)
			msg.Header.Set("Pgrelay-Event-Type", r.eventType)
			msg.Data = r.payload
			f, err := js.PublishMsgAsync(msg)
			if err != nil {
				return stopped(ctx, fmt.Errorf("minimal relay: publish: %w", err))
			}
			acks = append(acks, f)
		}
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		for _, f := range acks {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				cancel()
				return stopped(ctx, fmt.Errorf("minimal relay: publish: %w", err))
			case <-actx.Done():
				cancel()
				return stopped(ctx, errors.New("minimal relay: no acknowledgement in 30 s"))
			}
		}
		cancel()
		if len(batch) < minimalBatch {
			pause.Reset(minimalPoll)
			select {
			case <-ctx.Done():
				return nil
			case <-pause.C:
			}
		}
	}
}

func minimalConsumer(ctx context.Context, conn *pgx.Conn, js jetstream.JetStream, stream, prefix string) error {
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	cons, err := js.CreateOrUpdateConsumer(sctx, stream, jetstream.ConsumerConfig{
		Durable: "minimal", AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: prefix + ".>",
	})
	cancel()
	if err != nil {
		return fmt.Errorf("minimal consumer: %w", err)
	}
	msgs := make(chan jetstream.Msg, 4*minimalBatch)
	cc, err := cons.Consume(func(m jetstream.Msg) { msgs <- m }, jetstream.PullMaxMessages(2*minimalBatch))
	if err != nil {
		return fmt.Errorf("minimal consumer: %w", err)
	}
	defer cc.Stop()
	batch := make([]jetstream.Msg, 0, minimalBatch)
	for {
		batch = batch[:0]
		select {
		case m := <-msgs:
			batch = append(batch, m)
		case <-ctx.Done():
			return nil
		}
	more:
		for len(batch) < minimalBatch {
			select {
			case m := <-msgs:
				batch = append(batch, m)
			default:
				break more
			}
		}
		n := len(batch)
		ids, topics, types, orders, currencies := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		payloads, amounts := make([][]byte, n), make([]int64, n)
		for i, m := range batch {
			p, err := parsePaid(m.Data())
			if err != nil {
				return fmt.Errorf("minimal consumer: %w", err)
			}
			ids[i] = m.Headers().Get(jetstream.MsgIDHeader)
			topics[i] = strings.TrimPrefix(m.Subject(), prefix+".")
			types[i] = m.Headers().Get("Pgrelay-Event-Type")
			payloads[i], orders[i], amounts[i], currencies[i] = m.Data(), p.OrderID, p.AmountCents, p.Currency
		}
		qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := conn.Exec(qctx, minimalStore, ids, topics, types, payloads, orders, amounts, currencies)
		cancel()
		if err != nil {
			return stopped(ctx, fmt.Errorf("minimal consumer: store: %w", err))
		}
		for _, m := range batch {
			if err := m.Ack(); err != nil {
				return stopped(ctx, fmt.Errorf("minimal consumer: ack: %w", err))
			}
		}
	}
}

// stopped is nil when ctx ended (a stop), err otherwise.
func stopped(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}
