package migrations

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/pressly/goose/v3/lock"
)

// waitingLocker is a goose session locker that waits for the migration lock
// in PostgreSQL (pg_advisory_lock) instead of polling for it: goose's own
// Postgres locker retries pg_try_advisory_lock every 5 seconds (1 at the
// least), so every instance that lost the race at start-up slept for
// seconds after the winner had finished. Waiting in the server, the next
// instance gets the lock the moment it is released. The lock id is goose's,
// so the binaries and the goose CLI still exclude each other.
type waitingLocker struct{ id int64 }

func (l waitingLocker) SessionLock(ctx context.Context, conn *sql.Conn) error {
	if _, err := conn.ExecContext(ctx, "SELECT pg_catalog.pg_advisory_lock($1)", l.id); err != nil {
		return fmt.Errorf("migrations: wait for the migration lock: %w", err)
	}
	return nil
}

func (l waitingLocker) SessionUnlock(ctx context.Context, conn *sql.Conn) error {
	var released bool
	if err := conn.QueryRowContext(ctx, "SELECT pg_catalog.pg_advisory_unlock($1)", l.id).Scan(&released); err != nil {
		return fmt.Errorf("migrations: release the migration lock: %w", err)
	}
	if !released {
		return fmt.Errorf("migrations: the migration lock %d was not held", l.id)
	}
	return nil
}

var _ lock.SessionLocker = waitingLocker{}
