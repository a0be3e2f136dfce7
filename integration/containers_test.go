package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/internal/testnats"
)

// TestContainers is the path a user with Docker and no services takes: with
// TEST_DATABASE_URL and NATS_URL unset and PGRELAY_CONTAINER_TESTS set (`make
// containers` runs it so, together with TestEndToEnd and
// TestMalformedInputGoesDead), PostgreSQL is a container started by
// testcontainers-go's postgres module and NATS a generic container, both
// reached on ports Docker published. It requires that both really are
// containers, then runs the relay and the consumer on them: events written
// with plain SQL reach the ledger.
func TestContainers(t *testing.T) {
	if os.Getenv("PGRELAY_CONTAINER_TESTS") == "" {
		t.Skip("set PGRELAY_CONTAINER_TESTS=1 and unset TEST_DATABASE_URL and NATS_URL to run (make containers)")
	}
	for _, name := range []string{"TEST_DATABASE_URL", "NATS_URL"} {
		if v := os.Getenv(name); v != "" {
			t.Fatalf("%s is set (%q): the container path needs it unset", name, v)
		}
	}
	t.Parallel()
	dir := bins(t)
	dbURL := testdb.NewURL(t)
	require.True(t, testdb.FromContainer(t), "PostgreSQL did not come from a container: %s", testdb.Origin(t))
	t.Logf("PostgreSQL: %s", testdb.Origin(t))
	pool := newPool(t, dbURL)
	var version string
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT version()").Scan(&version))
	t.Logf("PostgreSQL serving: %s", version)

	natsURL := testnats.URL(t)
	require.True(t, strings.HasPrefix(natsURL, "nats://"), natsURL)
	stream, prefix := testnats.Stream(t, natsURL)
	nc, _ := testnats.Connect(t, natsURL)
	t.Logf("NATS serving: %s (server %s, JetStream stream %s)", natsURL, nc.ConnectedServerVersion(), stream)

	startService(t, filepath.Join(dir, "relay"), []string{
		"DATABASE_URL=" + dbURL, "NATS_URL=" + natsURL, "RELAY_STREAM=" + stream, "RELAY_SUBJECT_PREFIX=" + prefix,
		"METRICS_ADDR=", "ADMIN_ADDR=", "LOG_LEVEL=warn",
	}, "run")
	startService(t, filepath.Join(dir, "consumer"), consumerEnv(dbURL, natsURL, stream, prefix, "LOG_LEVEL=warn"), "run")

	const orders = 200
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range orders {
		id := fmt.Sprintf("c-%03d", i)
		_, err := pool.Exec(ctx, `INSERT INTO pgrelay.outbox (topic, key, event_type, payload)
			VALUES ('orders', $1, 'OrderCreated', convert_to($2, 'UTF8'))`,
			id, fmt.Sprintf(`{"order_id":%q,"customer_id":"c-1","amount_cents":%d,"currency":"EUR"}`, id, 100+i))
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM ledger_orders`) == orders
	}, 2*time.Minute, 50*time.Millisecond, "the ledger never got every order")
	require.Equal(t, int64(orders*100+orders*(orders-1)/2), queryInt(t, pool, `SELECT sum(amount_cents) FROM ledger_orders`))
	require.Equal(t, int64(orders), queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE status = 'processed'`))
}
