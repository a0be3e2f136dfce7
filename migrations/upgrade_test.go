package migrations_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	pgnats "github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/consumer"
	"github.com/pgrelay/pgrelay/internal/logtest"
	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/internal/testnats"
	"github.com/pgrelay/pgrelay/migrations"
	"github.com/pgrelay/pgrelay/relay"
)

// TestUpgradeFromPublicInstallation (issue 25): a database made by the
// release before pgrelay had a schema of its own (every object in public,
// versions in public.goose_db_version, shared with the service's own goose
// versions) holding a backlog (pending outbox rows, pending inbox rows) is
// migrated by this build: its versions are adopted without touching the
// service's rows, its objects move into pgrelay and end up exactly as a new
// installation's, plain SQL written for the old names still works through
// the compatibility views, and the relay and the consumer then drain the
// backlog, every event applied exactly once.
func TestUpgradeFromPublicInstallation(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url := testdb.EmptyURL(t)
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	defer pool.Close()
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	exec := func(q string, args ...any) {
		t.Helper()
		_, err := pool.Exec(ctx, q, args...)
		require.NoError(t, err, q)
	}

	// The old installation, sharing goose's table with the service.
	old, err := goose.NewProvider(goose.DialectPostgres, sqlDB, publicEra(t))
	require.NoError(t, err)
	_, err = old.Up(ctx)
	require.NoError(t, err)
	exec(`INSERT INTO public.goose_db_version (version_id, is_applied) VALUES (2, true), (20, true), (1000, true)`)
	exec(`CREATE TABLE public.applied (event_id text PRIMARY KEY, times int NOT NULL)`)
	// The backlog, written as plain SQL producers and ingesters wrote it.
	const outboxPending, inboxPending = 30, 12
	for i := range outboxPending {
		exec(`INSERT INTO public.outbox (topic, key, event_type, payload) VALUES ('orders', $1, 'OrderPaid', '\x7b7d')`, fmt.Sprintf("order-%d", i%4))
	}
	exec(`INSERT INTO public.outbox (event_id, topic, key) VALUES ('already-published', 'orders', 'order-0')`)
	exec(`UPDATE public.outbox SET status = 'published', published_at = now() WHERE event_id = 'already-published'`)
	for i := range inboxPending {
		exec(`INSERT INTO public.inbox (event_id, topic, event_type, payload) VALUES ($1, 'orders', 'OrderPaid', '\x7b7d')`, fmt.Sprintf("in-%d", i))
	}
	sharedRows := versionRows(t, ctx, pool, "public.goose_db_version")
	var oldCheck *migrations.SchemaError
	require.ErrorAs(t, migrations.Check(ctx, sqlDB), &oldCheck, "the old installation lacks version 100")
	require.EqualValues(t, 90, oldCheck.Current, "Check reads the old installation's versions as adopting them would")

	require.NoError(t, migrations.Up(ctx, sqlDB))
	allApplied(t, ctx, sqlDB)
	require.Equal(t, sharedRows, versionRows(t, ctx, pool, "public.goose_db_version"), "the shared version table is left as it was")
	adopted := versionRows(t, ctx, pool, migrations.TableName)
	require.Contains(t, adopted, "1:true")
	require.Contains(t, adopted, "90:true")
	require.Contains(t, adopted, "100:true")
	require.NotContains(t, adopted, "2:true")
	require.NotContains(t, adopted, "20:true")
	require.NotContains(t, adopted, "1000:true")

	// Moved: the same objects as a new installation, nothing of pgrelay's
	// left in public but the two views.
	fresh := testdb.New(t)
	require.Equal(t, objects(t, ctx, fresh, "pgrelay"), objects(t, ctx, pool, "pgrelay"))
	var left []string
	rows, err := pool.Query(ctx, `SELECT relkind::text || ' ' || relname FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relkind IN ('r', 'v', 'S') ORDER BY relname`)
	require.NoError(t, err)
	left, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"r applied", "r goose_db_version", "S goose_db_version_id_seq", "v inbox", "v outbox"}, left)
	var functions int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_proc WHERE pronamespace = 'public'::regnamespace`).Scan(&functions))
	require.Zero(t, functions)

	// The old plain-SQL contract, through the compatibility views: the
	// defaults, the insert triggers and RETURNING as before.
	var id, keySeq int64
	var eventID, status string
	var partition, want int
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO public.outbox (topic, key, event_type, payload) VALUES ('orders', 'order-1', 'OrderPaid', '\x7b7d')
		RETURNING id, event_id, key_seq, status, partition`).Scan(&id, &eventID, &keySeq, &status, &partition))
	require.Positive(t, id)
	require.NotEmpty(t, eventID)
	require.EqualValues(t, 9, keySeq, "order-1's sequence goes on (i % 4 == 1: 8 rows before)")
	require.Equal(t, "pending", status)
	require.NoError(t, pool.QueryRow(ctx, `SELECT pgrelay.outbox_partition('order-1')`).Scan(&want))
	require.Equal(t, want, partition)
	tag, err := pool.Exec(ctx, `INSERT INTO public.outbox (event_id, topic) VALUES ($1, 'orders') ON CONFLICT (event_id) DO NOTHING`, eventID)
	require.NoError(t, err)
	require.Zero(t, tag.RowsAffected(), "an idempotent retry through the view is absorbed")
	exec(`INSERT INTO public.inbox (event_id, topic, event_type, payload) VALUES ('in-late', 'orders', 'OrderPaid', '\x7b7d')`)
	var dedupKey string
	require.NoError(t, pool.QueryRow(ctx, `SELECT dedup_key FROM pgrelay.inbox WHERE event_id = 'in-late'`).Scan(&dedupKey))
	require.Equal(t, "in-late", dedupKey, "the inbox's identity trigger filled the key")

	// Drain: the relay publishes the outbox's backlog, the consumer stores
	// and applies it with the inbox's own backlog.
	natsURL := testnats.URL(t)
	stream, prefix := testnats.Stream(t, natsURL)
	log := logtest.NewAt(t, slog.LevelWarn)
	pub, err := pgnats.NewPublisher(ctx, pgnats.Config{URL: natsURL, SubjectPrefix: prefix, Stream: stream})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	r, err := relay.New(relay.Config{Pool: pool, Publisher: pub, PollInterval: 20 * time.Millisecond, Logger: log})
	require.NoError(t, err)
	nc := pgnats.Config{URL: natsURL, Stream: stream, SubjectPrefix: prefix, Durable: "upgrade",
		AckWait: 10 * time.Second, MaxAckPending: 200, MaxPayloadBytes: 1 << 20}
	c, err := consumer.New(consumer.Config{
		Pool: pool, FetchBatchSize: 20, MaxWait: 100 * time.Millisecond, StatsInterval: -1,
		RetryMin: 10 * time.Millisecond, RetryMax: 200 * time.Millisecond,
		Subscribe: func(ctx context.Context) (broker.Subscriber, error) { return pgnats.NewSubscriber(ctx, nc) },
		Inbox: pgrelay.InboxConfig{
			Handler: pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
				_, err := tx.Exec(ctx, `INSERT INTO public.applied (event_id, times) VALUES ($1, 1)
					ON CONFLICT (event_id) DO UPDATE SET times = applied.times + 1`, ev.EventID)
				return err
			}),
			PollInterval: 50 * time.Millisecond, BackoffMin: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
		},
		Logger: log,
	})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { require.NoError(t, r.Run(runCtx)) })
	wg.Go(func() { require.NoError(t, c.Run(runCtx)) })
	defer func() { stop(); wg.Wait() }()

	const total = outboxPending + 1 + inboxPending + 1
	require.Eventually(t, func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM public.applied`).Scan(&n)
		return n == total
	}, 60*time.Second, 50*time.Millisecond, "the backlog drains")
	var pending, maxTimes, published int
	require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM pgrelay.outbox WHERE status = 'pending'),
		(SELECT max(times) FROM public.applied), (SELECT count(*) FROM pgrelay.outbox WHERE status = 'published')`).Scan(&pending, &maxTimes, &published))
	require.Zero(t, pending)
	require.Equal(t, 1, maxTimes, "every event applied exactly once")
	require.Equal(t, outboxPending+2, published)
	var unexpected int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM public.applied WHERE event_id = 'already-published'`).Scan(&unexpected))
	require.Zero(t, unexpected, "a row published before the upgrade is not published again")
	_, js := testnats.Connect(t, natsURL)
	s, err := js.Stream(ctx, stream)
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	require.EqualValues(t, outboxPending+1, info.State.Msgs, "each pending outbox row published once")

	// Rolling back version 100 (and the later ones) drops the views and
	// keeps the data in pgrelay.
	stop()
	wg.Wait()
	p, err := migrations.NewProvider(sqlDB)
	require.NoError(t, err)
	_, err = p.DownTo(ctx, 99) // version 100 and every later one
	require.NoError(t, err)
	var views int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_views WHERE schemaname = 'public'`).Scan(&views))
	require.Zero(t, views)
	var kept int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.outbox`).Scan(&kept))
	require.Equal(t, outboxPending+2, kept)
	require.NoError(t, migrations.Up(ctx, sqlDB))
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_views WHERE schemaname = 'public'`).Scan(&views))
	require.Zero(t, views, "applied again on an installation already in pgrelay, version 100 creates no view")
}

// TestAdoptIntoTheTableTheGooseCLICreated: goose CLI users who ran the new
// migrations against an older installation before adopting it got the
// refusal of version 1, and a pgrelay.goose_db_version holding only goose's
// version 0 (goose creates it first): adopting still fills it, and the
// migrations then apply from where the installation was.
func TestAdoptIntoTheTableTheGooseCLICreated(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := testdb.EmptyURL(t)
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	defer pool.Close()
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	old, err := goose.NewProvider(goose.DialectPostgres, sqlDB, publicEra(t))
	require.NoError(t, err)
	_, err = old.Up(ctx)
	require.NoError(t, err)

	cli, err := goose.NewProvider(goose.DialectPostgres, sqlDB, migrations.FS, goose.WithTableName(migrations.TableName))
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `CREATE SCHEMA pgrelay`)
	require.NoError(t, err)
	_, err = cli.Up(ctx)
	require.ErrorContains(t, err, "pgrelay is already installed in schema public")
	require.Equal(t, []string{"0:true"}, versionRows(t, ctx, pool, migrations.TableName))

	_, err = pool.Exec(ctx, migrations.AdoptSQL)
	require.NoError(t, err)
	_, err = cli.Up(ctx)
	require.NoError(t, err)
	allApplied(t, ctx, sqlDB)
	var inPgrelay bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT to_regclass('pgrelay.outbox') IS NOT NULL AND to_regclass('pgrelay.inbox_key_state') IS NOT NULL`).Scan(&inPgrelay))
	require.True(t, inPgrelay)
}
