// Package cetest is the consumer side of the CloudEvents interoperability
// tests of the broker adapters: a pgrelay consumer over a subscriber whose
// handler records each application in a table, and readers of the inbox and
// of that table. Tests only.
package cetest

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/consumer"
	"github.com/pgrelay/pgrelay/internal/logtest"
)

// Row is one inbox row, as the tests check it.
type Row struct {
	Status, Topic, Key, EventType, LastError string
	KeySeq                                   int64
	Payload                                  []byte
	Headers                                  map[string]string
	OccurredAt                               time.Time
}

// Consume runs a pgrelay consumer over subscribe until the test ends. Its
// handler inserts one row per application into ce_applied (event id, event
// type, key, payload) in the inbox transaction, so Applied counts only
// applications that committed.
// Options, when given, adjust the consumer's config (ordered apply).
func Consume(t *testing.T, pool *pgxpool.Pool, subscribe func(context.Context) (broker.Subscriber, error), options ...func(*consumer.Config)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS ce_applied (n bigserial, event_id text NOT NULL, event_type text NOT NULL, key text NOT NULL, key_seq bigint NOT NULL, payload bytea NOT NULL)`)
	if err != nil {
		t.Fatal(err)
	}
	h := pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
		_, err := tx.Exec(ctx, `INSERT INTO ce_applied (event_id, event_type, key, key_seq, payload) VALUES ($1, $2, $3, $4, $5)`, ev.EventID, ev.EventType, ev.Key, ev.KeySeq, ev.Payload)
		return err
	})
	log := logtest.NewAt(t, slog.LevelWarn)
	cfg := consumer.Config{
		Pool: pool, FetchBatchSize: 20, MaxWait: 100 * time.Millisecond, StatsInterval: -1,
		RetryMin: 10 * time.Millisecond, RetryMax: 200 * time.Millisecond,
		Subscribe: subscribe,
		Inbox: pgrelay.InboxConfig{Handler: h, PollInterval: 50 * time.Millisecond,
			BackoffMin: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond},
		Logger: log,
	}
	for _, o := range options {
		o(&cfg)
	}
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := c.Run(runCtx); err != nil {
			t.Errorf("consumer: %v", err)
		}
	})
	t.Cleanup(func() { stop(); wg.Wait() })
}

// WaitInbox waits until the inbox holds n rows, every one processed or
// dead, and returns them by event id.
func WaitInbox(t *testing.T, pool *pgxpool.Pool, n int) map[string]Row {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		rows := inboxRows(t, pool)
		settled := len(rows) == n
		for _, r := range rows {
			if r.Status != "processed" && r.Status != "dead" {
				settled = false
			}
		}
		if settled {
			return rows
		}
		if time.Now().After(deadline) {
			t.Fatalf("inbox: want %d settled rows, have %+v", n, rows)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func inboxRows(t *testing.T, pool *pgxpool.Pool) map[string]Row {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rs, err := pool.Query(ctx, `SELECT event_id, status, topic, key, event_type, coalesce(last_error, ''), coalesce(key_seq, 0), payload, headers, occurred_at FROM pgrelay.inbox`)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	out := map[string]Row{}
	for rs.Next() {
		var id string
		var r Row
		var headers []byte
		if err := rs.Scan(&id, &r.Status, &r.Topic, &r.Key, &r.EventType, &r.LastError, &r.KeySeq, &r.Payload, &headers, &r.OccurredAt); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(headers, &r.Headers); err != nil {
			t.Fatal(err)
		}
		out[id] = r
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// Applied returns how many times the handler's application of each event
// committed.
func Applied(t *testing.T, pool *pgxpool.Pool) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rs, err := pool.Query(ctx, `SELECT event_id, count(*) FROM ce_applied GROUP BY event_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	out := map[string]int{}
	for rs.Next() {
		var id string
		var n int
		if err := rs.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		out[id] = n
	}
	return out
}

// AppliedSeqs returns, per key, the key sequences of the events applied, in
// the order their applications committed.
func AppliedSeqs(t *testing.T, pool *pgxpool.Pool) map[string][]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rs, err := pool.Query(ctx, `SELECT key, key_seq FROM ce_applied ORDER BY n`)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	out := map[string][]int64{}
	for rs.Next() {
		var k string
		var seq int64
		if err := rs.Scan(&k, &seq); err != nil {
			t.Fatal(err)
		}
		out[k] = append(out[k], seq)
	}
	return out
}
