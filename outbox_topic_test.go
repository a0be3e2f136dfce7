package pgrelay_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// TestTopicRuleSameForEnqueueAndSQL: Enqueue and a plain-SQL INSERT accept
// and refuse the same topics. A plain-SQL topic such as "orders.*" used to be
// stored and published to the literal wildcard subject, and "a b" went dead
// at the broker; the outbox_topic_valid constraint now refuses both at the
// producer's insert (SQLSTATE 23514).
func TestTopicRuleSameForEnqueueAndSQL(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	o, err := pgrelay.NewOutbox(pgrelay.OutboxConfig{})
	require.NoError(t, err)
	topics := map[string]bool{ // topic: valid
		"orders": true, "orders.created": true, "Orders_v2.created-EU.x9": true, "a": true, "-": true, "_.-": true,
		strings.Repeat("t", 255): true, strings.Repeat("t.", 127) + "t": true,
		"orders.*": false, "orders.>": false, "*": false, ">": false, "a b": false, "a\tb": false,
		".orders": false, "orders.": false, "orders..created": false, ".": false, strings.Repeat("t", 256): false,
		"ordérs": false, "orders/created": false, "orders:created": false, "a\nb": false, "a\\b": false,
	}
	for topic, valid := range topics {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		enqErr := o.Enqueue(ctx, tx, pgrelay.Message{Topic: topic, Key: "k", Payload: []byte("{}")})
		require.NoError(t, tx.Rollback(ctx))

		tx, err = pool.Begin(ctx)
		require.NoError(t, err)
		_, sqlErr := tx.Exec(ctx, `INSERT INTO pgrelay.outbox (topic, key, payload) VALUES ($1, 'k', '{}')`, topic)
		require.NoError(t, tx.Rollback(ctx))

		require.Equal(t, valid, event.ValidTopic(topic), "ValidTopic %q", topic)
		if valid {
			require.NoError(t, enqErr, "Enqueue %q", topic)
			require.NoError(t, sqlErr, "SQL %q", topic)
			continue
		}
		require.ErrorContains(t, enqErr, "is invalid", "Enqueue %q", topic)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(sqlErr, &pgErr), "SQL %q: want a check violation, got %v", topic, sqlErr)
		require.Equal(t, "23514", pgErr.Code, "SQL %q: %v", topic, sqlErr)
		require.Equal(t, "outbox_topic_valid", pgErr.ConstraintName, "SQL %q", topic)
	}
}
