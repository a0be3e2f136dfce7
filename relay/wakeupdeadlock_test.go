package relay

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/notifier"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// TestProducersCrossingArmedPartitionsDoNotWait: two producer transactions
// that insert into two armed partitions in opposite orders, one statement
// at a time, neither wait for each other nor deadlock on the partitions'
// wake-up flags (different keys: nothing orders them), and the first insert
// into each armed partition still notifies.
func TestProducersCrossingArmedPartitionsDoNotWait(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Four keys: two in one partition, two in another.
	var pa, pb int32 = -1, -1
	var ka, ka2, kb, kb2 string
	for i := 0; ka2 == "" || kb2 == ""; i++ {
		k := fmt.Sprintf("key-%d", i)
		var p int32
		require.NoError(t, pool.QueryRow(ctx, `SELECT pgrelay.outbox_partition($1)`, k).Scan(&p))
		switch {
		case pa < 0:
			pa, ka = p, k
		case p == pa && ka2 == "":
			ka2 = k
		case p != pa && pb < 0:
			pb, kb = p, k
		case p == pb && kb2 == "":
			kb2 = k
		}
	}
	listen, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer listen.Release()
	_, err = listen.Exec(ctx, "LISTEN "+notifier.OutboxChannel)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE pgrelay.relay_wakeups SET armed = true WHERE partition = ANY($1)`, []int32{pa, pb})
	require.NoError(t, err)

	begin := func() pgx.Tx {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `SET LOCAL lock_timeout = '2s'`)
		require.NoError(t, err)
		return tx
	}
	insert := func(tx pgx.Tx, key string) error {
		_, err := tx.Exec(ctx, `INSERT INTO pgrelay.outbox (topic, key) VALUES ('orders', $1)`, key)
		return err
	}
	a, b := begin(), begin()
	defer func() { _ = a.Rollback(ctx); _ = b.Rollback(ctx) }()
	require.NoError(t, insert(a, ka)) // disarms pa
	require.NoError(t, insert(b, kb)) // disarms pb
	// a into pb while b holds pb's flag, and b into pa while a holds pa's:
	// before, each waited for the other (a deadlock, or lock_timeout here).
	errs := make(chan error, 1)
	go func() { errs <- insert(a, kb2) }()
	require.NoError(t, insert(b, ka2), "b's insert into the partition a disarmed")
	require.NoError(t, <-errs, "a's insert into the partition b disarmed")
	require.NoError(t, a.Commit(ctx))
	require.NoError(t, b.Commit(ctx))

	got := map[string]bool{}
	for len(got) < 2 {
		n, err := listen.Conn().WaitForNotification(ctx)
		require.NoError(t, err, "notifications so far: %v", got)
		got[n.Payload] = true
	}
	require.Equal(t, map[string]bool{fmt.Sprint(pa): true, fmt.Sprint(pb): true}, got)
	var armed int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.relay_wakeups WHERE armed`).Scan(&armed))
	require.Zero(t, armed)
}
