package migrations_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/testdb"
)

// TestWALEmitGrantedToOutboxProducers: upgrading to 00116 takes pgrelay.emit
// (and the new pgrelay.emit_wal) from PUBLIC, and grants both to the roles
// that may insert into pgrelay.outbox or pgrelay.outbox_wal (they may already
// produce any event), so they keep producing; rolling it back gives emit back
// to PUBLIC.
func TestWALEmitGrantedToOutboxProducers(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool, version, ops := provider(t, url, false)
	for {
		v, err := version(ctx)
		require.NoError(t, err)
		if v < 116 {
			break
		}
		_, err = ops.down(ctx)
		require.NoError(t, err)
	}
	suffix := fmt.Sprint(time.Now().UnixNano())
	producer, walProducer, other := "p_"+suffix, "pw_"+suffix, "o_"+suffix
	_, err := pool.Exec(ctx, fmt.Sprintf(`CREATE ROLE %[1]s; CREATE ROLE %[2]s; CREATE ROLE %[3]s;
		GRANT INSERT ON pgrelay.outbox TO %[1]s; GRANT INSERT ON pgrelay.outbox_wal TO %[2]s`, producer, walProducer, other))
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, r := range []string{producer, walProducer, other} {
			_, _ = pool.Exec(ctx, fmt.Sprintf(`DROP OWNED BY %[1]s; DROP ROLE %[1]s`, r))
		}
	})
	may := func(role, fn string) bool {
		var ok bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT has_function_privilege($1, $2, 'EXECUTE')`, role, fn).Scan(&ok))
		return ok
	}
	const emit = "pgrelay.emit(text, bytea, text, text, jsonb, text, text, timestamptz)"
	require.True(t, may(other, emit), "before 00116 anyone may emit")

	require.NoError(t, ops.up(ctx))
	for _, fn := range []string{emit, "pgrelay.emit_wal(bytea[])"} {
		require.True(t, may(producer, fn), "%s keeps producing: %s", producer, fn)
		require.True(t, may(walProducer, fn), "%s keeps producing: %s", walProducer, fn)
		require.False(t, may(other, fn), "%s may not produce: %s", other, fn)
	}
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.wal_keys`).Scan(&n))
	require.Equal(t, 1, n, "a signing key")
	for _, r := range []string{producer, other} {
		var readable bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT has_table_privilege($1, 'pgrelay.wal_keys', 'SELECT')`, r).Scan(&readable))
		require.False(t, readable, "%s reads the key", r)
	}
}
