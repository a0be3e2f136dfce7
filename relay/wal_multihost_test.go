package relay

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/testcluster"
	"github.com/pgrelay/pgrelay/internal/testnats"
)

// TestWALThroughMultiHostURL: with a pool on a multi-host URL naming a hot
// standby first, the WAL capture's replication connection (the pool's
// settings plus replication=database) passes the standby over, as
// target_session_attrs=read-write asks, and streams from the primary.
func TestWALThroughMultiHostURL(t *testing.T) {
	pair := testcluster.StartPair(t, walConf)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, pair.URL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	natsURL := testnats.URL(t)
	stream, prefix := testnats.Stream(t, natsURL)
	_, js := testnats.Connect(t, natsURL)
	b := &bundle{pool: pool, dbURL: pair.URL(), natsURL: natsURL, stream: stream, prefix: prefix, js: js}
	ch := b.subscribe(t)
	r, _ := start(t, b.walConfig(t, b.publisher(t), &countingObserver{}))
	waitReading(t, r)
	b.emit(t, pgrelay.Message{EventID: "e1", Topic: "orders", Key: "k", Payload: []byte("1")})
	require.Equal(t, "e1", readAll(t, ch, 1, 20*time.Second)[0].eventID)
}
