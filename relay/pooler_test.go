package relay_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/internal/testpgbouncer"
	"github.com/pgrelay/pgrelay/relay"
)

// recordingPublisher acknowledges every message and counts each event id.
type recordingPublisher struct {
	mu   sync.Mutex
	seen map[string]int
}

func (p *recordingPublisher) Publish(_ context.Context, msgs []pgrelay.Message) []broker.Result {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range msgs {
		p.seen[m.EventID]++
	}
	return make([]broker.Result, len(msgs))
}
func (p *recordingPublisher) Close() error { return nil }

func (p *recordingPublisher) count() (events, published int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, n := range p.seen {
		published += n
	}
	return len(p.seen), published
}

// TestLibraryThroughPgBouncerTransactionMode: the relay library on a pool
// through a stock PgBouncer in transaction mode (described statements, no
// start-up parameters) with NoListen, and with ListenConnConfig straight to
// PostgreSQL, publishes every event once.
func TestLibraryThroughPgBouncerTransactionMode(t *testing.T) {
	t.Parallel()
	for _, listen := range []bool{false, true} {
		t.Run(fmt.Sprintf("listen=%v", listen), func(t *testing.T) {
			t.Parallel()
			direct := testdb.NewURL(t)
			pgb := testpgbouncer.URL(t, direct, testpgbouncer.Transaction)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			app, err := pgxpool.New(ctx, direct)
			require.NoError(t, err)
			defer app.Close()

			cfg, err := pgxpool.ParseConfig(pgb)
			require.NoError(t, err)
			cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
			cfg.MaxConns = int32(relay.PoolConns(16))
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			defer pool.Close()

			pub := &recordingPublisher{seen: map[string]int{}}
			rc := relay.Config{Pool: pool, Publisher: pub, PollInterval: 50 * time.Millisecond, NoListen: !listen}
			if listen {
				rc.ListenConnConfig, err = pgx.ParseConfig(direct)
				require.NoError(t, err)
			}
			r, err := relay.New(rc)
			require.NoError(t, err)
			rctx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- r.Run(rctx) }()

			const n = 500
			for i := 0; i < n; i += 50 {
				require.NoError(t, pgx.BeginFunc(ctx, app, func(tx pgx.Tx) error {
					for j := i; j < i+50; j++ {
						if err := pgrelay.Enqueue(ctx, tx, pgrelay.Message{Topic: "orders", Key: fmt.Sprintf("k-%d", j%37), EventType: "t", Payload: []byte(`{}`)}); err != nil {
							return err
						}
					}
					return nil
				}))
			}
			require.Eventually(t, func() bool {
				var left int64
				return app.QueryRow(ctx, `SELECT count(*) FROM pgrelay.outbox WHERE status <> 'published'`).Scan(&left) == nil && left == 0
			}, time.Minute, 20*time.Millisecond)
			// LISTEN runs on the direct connection when given one, and
			// nowhere (not on a server connection PgBouncer shares) without.
			var listening int64
			require.NoError(t, app.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND query LIKE 'LISTEN %'`).Scan(&listening))
			require.Equal(t, map[bool]int64{false: 0, true: 1}[listen], listening, "one connection listening, straight to PostgreSQL, or none")
			stop()
			require.NoError(t, <-done)
			events, published := pub.count()
			require.Equal(t, n, events)
			require.Equal(t, n, published, "each event published once")
		})
	}
}
