// Package migrations holds pgrelay's goose SQL migrations, embedded so the
// binaries can apply them, and readable by the goose CLI:
//
//	goose -dir migrations postgres "$DATABASE_URL" up
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"fmt"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// FS holds the SQL migration files.
//
//go:embed *.sql
var FS embed.FS

// NewProvider returns a goose provider over the embedded migrations. It holds a
// Postgres session lock while migrating (goose's lock id, waited for in the
// server rather than polled), so several instances starting at once apply
// each migration exactly once and the later ones go on as soon as the first
// is done.
func NewProvider(db *sql.DB) (*goose.Provider, error) {
	locker := waitingLocker{id: lock.DefaultLockID}
	p, err := goose.NewProvider(goose.DialectPostgres, db, FS, goose.WithSessionLocker(locker))
	if err != nil {
		return nil, fmt.Errorf("migrations: provider: %w", err)
	}
	return p, nil
}

// Up applies every pending migration.
func Up(ctx context.Context, db *sql.DB) error {
	p, err := NewProvider(db)
	if err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrations: up: %w", err)
	}
	return nil
}
