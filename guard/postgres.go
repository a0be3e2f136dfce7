package guard

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/internal/db"
)

// PostgresStore keeps reservations in the guard_keys table. A reservation
// survives any restart of the caller; the table grows by one row per key
// until Clean removes expired ones.
type PostgresStore struct {
	pool *pgxpool.Pool
	q    *db.Queries
}

// NewPostgresStore returns a store on pool (migrated with pgrelay's
// migrations).
func NewPostgresStore(pool *pgxpool.Pool) *PostgresStore {
	return &PostgresStore{pool: pool, q: db.New()}
}

// Name implements Store.
func (s *PostgresStore) Name() string { return "postgres" }

// Reserve implements Store.
func (s *PostgresStore) Reserve(ctx context.Context, key, token string, ttl time.Duration) (State, error) {
	_, err := s.q.GuardReserve(ctx, s.pool, db.GuardReserveParams{Key: key, Token: token, TtlSeconds: ttl.Seconds()})
	if err == nil {
		return Acquired, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return 0, err
	}
	st, err := s.q.GuardState(ctx, s.pool, key)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return InProgress, nil // expired just now: report busy rather than loop
	case err != nil:
		return 0, err
	case st.State == "confirmed":
		return Done, nil
	}
	return InProgress, nil
}

func lost(n int64, err error) error {
	if err != nil {
		return err
	}
	if n == 0 {
		return ErrLeaseLost
	}
	return nil
}

// Confirm implements Store. It succeeds after the lease ended as long as
// nobody reserved the key since and it was not cleaned.
func (s *PostgresStore) Confirm(ctx context.Context, key, token string, keep time.Duration) error {
	return lost(s.q.GuardConfirm(ctx, s.pool, db.GuardConfirmParams{Key: key, Token: token, KeepSeconds: keep.Seconds()}))
}

// Extend implements Store.
func (s *PostgresStore) Extend(ctx context.Context, key, token string, ttl time.Duration) error {
	return lost(s.q.GuardExtend(ctx, s.pool, db.GuardExtendParams{Key: key, Token: token, TtlSeconds: ttl.Seconds()}))
}

// Release implements Store.
func (s *PostgresStore) Release(ctx context.Context, key, token string) error {
	return lost(s.q.GuardRelease(ctx, s.pool, db.GuardReleaseParams{Key: key, Token: token}))
}

// Stats implements Store: live keys (a count over the table) and the
// table's total size.
func (s *PostgresStore) Stats(ctx context.Context) (Stats, error) {
	r, err := s.q.GuardStats(ctx, s.pool)
	if err != nil {
		return Stats{}, err
	}
	return Stats{ActiveKeys: r.Active, StorageBytes: r.Bytes}, nil
}

// Clean deletes expired keys in batches of batchSize until none is left;
// each statement is bounded by timeout. It returns how many it deleted.
func (s *PostgresStore) Clean(ctx context.Context, batchSize int, timeout time.Duration) (int64, error) {
	if batchSize < 1 || timeout <= 0 {
		return 0, fmt.Errorf("guard: Clean needs a positive batchSize and timeout, got %d and %s", batchSize, timeout)
	}
	var total int64
	for {
		qctx, cancel := context.WithTimeout(ctx, timeout)
		n, err := s.q.GuardDeleteExpired(qctx, s.pool, int32(batchSize))
		cancel()
		total += n
		if err != nil {
			return total, fmt.Errorf("guard: clean expired keys: %w", err)
		}
		if n < int64(batchSize) {
			return total, nil
		}
	}
}
