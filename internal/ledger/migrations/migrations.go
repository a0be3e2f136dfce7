// Package migrations holds the worked example's schema: the ledger the
// consumer's ledger handler credits (ledger_orders, ledger_entries) and the
// demo shop (shop_orders). It is not part of pgrelay's own migrations, so a
// user's database gets these tables only when asked: `consumer migrate up
// --example-schema`, the demo, the benchmark, the fault suite and the tests
// apply it. goose records it in a version table of its own,
// pgrelay_example_version, so its versions never mix with pgrelay's:
//
//	goose -dir internal/ledger/migrations -table pgrelay_example_version postgres "$DATABASE_URL" up
//
// Databases migrated before the example schema left pgrelay's migrations
// (where it was versions 2 and 20) already hold these tables: its CREATE
// statements use IF NOT EXISTS, so applying it there adopts them, rows and all.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"strings"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/pgrelay/pgrelay/internal/db"
)

// TableName is goose's version table for the example schema.
const TableName = "pgrelay_example_version"

// lockID is the advisory lock held while migrating the example schema: not
// goose's default, which pgrelay's own migrations hold.
const lockID = 5887940537704921355

// FS holds the example schema's SQL migration files.
//
//go:embed *.sql
var FS embed.FS

// NewProvider returns a goose provider over the example schema, recording
// its versions in TableName.
func NewProvider(sqlDB *sql.DB) (*goose.Provider, error) {
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(lockID))
	if err != nil {
		return nil, fmt.Errorf("example schema: locker: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, FS,
		goose.WithTableName(TableName), goose.WithSessionLocker(locker))
	if err != nil {
		return nil, fmt.Errorf("example schema: provider: %w", err)
	}
	return p, nil
}

// Up applies every pending migration of the example schema.
func Up(ctx context.Context, sqlDB *sql.DB) error {
	p, err := NewProvider(sqlDB)
	if err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("example schema: up: %w", err)
	}
	return nil
}

// MissingError reports a database without the tables the ledger handler
// writes to.
type MissingError struct {
	// Tables lists the missing tables.
	Tables []string
	// NoPgrelay: pgrelay's own schema is missing too (an unmigrated
	// database), which the services' start-up check reports first.
	NoPgrelay bool
}

func (e *MissingError) Error() string {
	return fmt.Sprintf("the ledger handler needs the example schema, and the database lacks %s; create it with: consumer migrate up --example-schema",
		strings.Join(e.Tables, ", "))
}

// Check reports a *MissingError when the ledger handler's tables are absent
// from the database (as seen through its search_path). It looks for the
// tables rather than for versions in TableName, so a database whose ledger
// was created by pgrelay's own migrations before the example schema left
// them passes as it is.
func Check(ctx context.Context, q db.DBTX) error {
	present, err := db.New().LedgerSchemaPresent(ctx, q)
	if err != nil {
		return fmt.Errorf("example schema: look for the ledger tables: %w", err)
	}
	var missing []string
	if !present.Orders {
		missing = append(missing, "ledger_orders")
	}
	if !present.Entries {
		missing = append(missing, "ledger_entries")
	}
	if len(missing) > 0 {
		return &MissingError{Tables: missing, NoPgrelay: !present.Pgrelay}
	}
	return nil
}
