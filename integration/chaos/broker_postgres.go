package chaos

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/postgres"
)

// BrokerPostgres runs the services with PostgreSQL as the broker: the relay
// stores straight into the inbox of the run's database, through a proxy of
// its own (the broker faults strike that link); the consumers run their
// workers only.
const BrokerPostgres = "postgres"

// postgresEnv is the brokerEnv of a BrokerPostgres run. The "broker" is the
// run's own PostgreSQL (the pg-restart fault restarts it); what it stored is
// the inbox, read back batch by batch (received_at) and, within a batch, in
// key sequence.
type postgresEnv struct {
	addr string
	pool *pgxpool.Pool

	mu  sync.Mutex
	pub *postgres.Publisher
}

func startPostgresEnv(ctx context.Context, addr string) (*postgresEnv, error) {
	pool, err := pgxpool.New(ctx, fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable&connect_timeout=5", addr))
	if err != nil {
		return nil, err
	}
	return &postgresEnv{addr: addr, pool: pool}, nil
}

func (e *postgresEnv) label() string    { return "PostgreSQL (broker)" }
func (e *postgresEnv) upstream() string { return e.addr }

func (e *postgresEnv) close() {
	e.mu.Lock()
	if e.pub != nil {
		_ = e.pub.Close()
	}
	e.mu.Unlock()
	e.pool.Close()
}

func (e *postgresEnv) serviceEnv(proxied string) (relay, consumer []string) {
	return []string{"PGRELAY_BROKER=postgres",
			"PG_TARGET_URL=postgres://postgres@" + proxied + "/postgres?sslmode=disable&connect_timeout=5"},
		[]string{"PGRELAY_BROKER=postgres"}
}

func (e *postgresEnv) restart(context.Context, time.Duration) error {
	return errors.New("chaos: the PostgreSQL broker is the run's database: pg-restart restarts it")
}

// outstanding: nothing is ever in flight between the relay's commit into
// the inbox and the consumers.
func (e *postgresEnv) outstanding(context.Context) (int64, int64, error) { return 0, 0, nil }

// publisher returns the injections' publisher, created once the run's
// database is migrated.
func (e *postgresEnv) publisher(ctx context.Context) (*postgres.Publisher, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.pub == nil {
		p, err := postgres.NewPublisher(ctx, postgres.Config{Pool: e.pool})
		if err != nil {
			return nil, err
		}
		e.pub = p
	}
	return e.pub, nil
}

func (e *postgresEnv) store(ctx context.Context, msgs []pgrelay.Message) ([]broker.Result, error) {
	p, err := e.publisher(ctx)
	if err != nil {
		return nil, err
	}
	res := p.Publish(ctx, msgs)
	for i, r := range res {
		if r.Err != nil {
			return nil, fmt.Errorf("chaos: store %s into the inbox: %w", msgs[i].EventID, r.Err)
		}
	}
	return res, nil
}

func (e *postgresEnv) publishRaw(ctx context.Context, id, typ, key string, payload []byte) error {
	_, err := e.store(ctx, []pgrelay.Message{{EventID: id, Topic: "orders", Key: key, EventType: typ, Payload: payload,
		OccurredAt: time.Now()}})
	return err
}

// injectDuplicates stores random inbox events again, as a relay repeating a
// batch would: the inbox must absorb every copy.
func (e *postgresEnv) injectDuplicates(ctx context.Context, rng *mrand.Rand, _ uint64) (string, int, error) {
	rows, err := e.pool.Query(ctx, `SELECT event_id, topic, key, coalesce(key_seq, 0), event_type, payload, occurred_at
		FROM pgrelay.inbox TABLESAMPLE BERNOULLI (20) REPEATABLE ($1) LIMIT $2`, rng.Int32(), 10+rng.IntN(20))
	if err != nil {
		return "", 0, err
	}
	var msgs []pgrelay.Message
	for rows.Next() {
		var m pgrelay.Message
		if err := rows.Scan(&m.EventID, &m.Topic, &m.Key, &m.KeySeq, &m.EventType, &m.Payload, &m.OccurredAt); err != nil {
			rows.Close()
			return "", 0, err
		}
		msgs = append(msgs, m)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return "", 0, err
	}
	if len(msgs) == 0 {
		return "skipped: the inbox is still empty", 0, nil
	}
	res, err := e.store(ctx, msgs)
	if err != nil {
		return "", 0, err
	}
	absorbed := 0
	for _, r := range res {
		if r.Duplicate {
			absorbed++
		}
	}
	if absorbed != len(msgs) {
		return "", 0, fmt.Errorf("chaos: %d of %d stored events stored again were reported as duplicates", absorbed, len(msgs))
	}
	return fmt.Sprintf("%d stored events stored again (all absorbed by the inbox)", len(msgs)), len(msgs), nil
}

// readLog returns the inbox's events as the relay stored them: batch by
// batch (a batch's rows share their transaction's received_at), and within a
// batch in key sequence, the order the inbox applies a key in, each with the
// time it was stored.
func (e *postgresEnv) readLog(ctx context.Context) ([]streamMsg, error) {
	rows, err := e.pool.Query(ctx, `SELECT event_id, key, received_at FROM pgrelay.inbox
		ORDER BY received_at, key, key_seq NULLS FIRST, event_id`)
	if err != nil {
		return nil, fmt.Errorf("chaos: read the inbox: %w", err)
	}
	defer rows.Close()
	var out []streamMsg
	for rows.Next() {
		var m streamMsg
		// received_at (the storing transaction's start) is the broker's
		// time of storing it.
		if err := rows.Scan(&m.eventID, &m.key, &m.stored); err != nil {
			return nil, err
		}
		m.msgID, m.seq = m.eventID, uint64(len(out)+1)
		out = append(out, m)
	}
	return out, rows.Err()
}
