// Package migrations holds pgrelay's goose SQL migrations, embedded so the
// binaries can apply them, and readable by the goose CLI. Every pgrelay
// object lives in the schema pgrelay, and goose records pgrelay's versions
// in pgrelay.goose_db_version, never in the application's goose_db_version
// (docs/schema.md):
//
//	psql "$DATABASE_URL" -c 'CREATE SCHEMA IF NOT EXISTS pgrelay'
//	goose -dir migrations -table pgrelay.goose_db_version postgres "$DATABASE_URL" up
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
	"github.com/pressly/goose/v3/lock"
)

// FS holds the SQL migration files.
//
//go:embed *.sql
var FS embed.FS

// Schema is the PostgreSQL schema that holds every pgrelay object. It is
// fixed: the migrations, the queries and the functions' bodies name it.
const Schema = "pgrelay"

// TableName is goose's version table for pgrelay's migrations (the goose
// CLI's -table).
const TableName = Schema + ".goose_db_version"

// NewProvider returns a goose provider over the embedded migrations, recording
// versions in TableName. It holds a Postgres session lock while migrating
// (goose's lock id, waited for in the server rather than polled), so several
// instances starting at once apply each migration exactly once and the later
// ones go on as soon as the first is done. Before goose first looks for its
// version table, the provider creates the schema and adopts the versions of
// an installation made before pgrelay had a schema of its own (AdoptSQL).
func NewProvider(db *sql.DB) (*goose.Provider, error) {
	locker := waitingLocker{id: lock.DefaultLockID}
	base, err := database.NewStore(database.DialectPostgres, TableName)
	if err != nil {
		return nil, fmt.Errorf("migrations: store: %w", err)
	}
	ext, ok := base.(database.StoreExtender)
	if !ok {
		return nil, errors.New("migrations: the postgres store cannot check for its table")
	}
	p, err := goose.NewProvider(goose.DialectCustom, db, FS,
		goose.WithStore(adoptingStore{StoreExtender: ext}), goose.WithSessionLocker(locker))
	if err != nil {
		return nil, fmt.Errorf("migrations: provider: %w", err)
	}
	return p, nil
}

// adoptingStore is goose's Postgres store whose check for the version table
// first runs AdoptSQL: goose calls it once per provider, before anything else
// touches the table (AdoptSQL takes goose's migration lock itself, for the
// operations goose runs without it).
type adoptingStore struct {
	database.StoreExtender
}

func (s adoptingStore) TableExists(ctx context.Context, db database.DBTxConn) (bool, error) {
	if _, err := db.ExecContext(ctx, AdoptSQL); err != nil {
		return false, fmt.Errorf("migrations: create schema %s and adopt an older installation's versions: %w", Schema, err)
	}
	return s.StoreExtender.TableExists(ctx, db)
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

// Status is a database's pgrelay schema measured against the embedded
// migrations.
type Status struct {
	// Current is the highest migration version applied (0: none).
	Current int64 `json:"version"`
	// Latest is the highest embedded migration version.
	Latest int64 `json:"latest"`
	// Pending lists the embedded versions not applied, in order.
	Pending []int64 `json:"pending"`
}

// Behind reports whether some embedded migration is not applied.
func (s Status) Behind() bool { return len(s.Pending) > 0 }

// Require returns a *SchemaError when a migration up to version minimum is
// not applied; minimum 0 requires every embedded migration.
func (s Status) Require(minimum int64) error {
	if minimum <= 0 || minimum > s.Latest {
		minimum = s.Latest
	}
	if len(s.Pending) == 0 || s.Pending[0] > minimum {
		return nil
	}
	return &SchemaError{Current: s.Current, Required: s.Latest, Minimum: minimum, Pending: s.Pending}
}

// SchemaError reports a database whose schema lacks migrations this build
// needs.
type SchemaError struct {
	// Current is the highest migration version applied (0: none).
	Current int64
	// Required is the highest embedded migration version.
	Required int64
	// Minimum is the version up to which the caller needs every migration:
	// Required, unless it runs on an older schema too (the relay).
	Minimum int64
	// Pending lists the embedded versions not applied, in order.
	Pending []int64
}

func (e *SchemaError) Error() string {
	pending := make([]string, len(e.Pending))
	for i, v := range e.Pending {
		pending[i] = strconv.FormatInt(v, 10)
	}
	state := fmt.Sprintf("at version %d", e.Current)
	if e.Current == 0 {
		state = "not migrated (no pgrelay migration applied)"
	}
	if e.Minimum > 0 && e.Minimum < e.Required {
		return fmt.Sprintf("database schema is %s, this build needs version %d at least (latest %d; pending: %s)",
			state, e.Minimum, e.Required, strings.Join(pending, ", "))
	}
	return fmt.Sprintf("database schema is %s, this build needs version %d (pending: %s)",
		state, e.Required, strings.Join(pending, ", "))
}

// Check reports a *SchemaError when the database has not applied every
// embedded migration (ReadStatus, then Status.Require(0)).
func Check(ctx context.Context, db *sql.DB) error {
	st, err := ReadStatus(ctx, db)
	if err != nil {
		return err
	}
	return st.Require(0)
}

// ReadStatus reads the database's schema version. It only reads: unlike
// goose's own checks it creates no schema or version table, so it is safe
// beside a concurrent `migrate up`. An installation made before pgrelay had
// a schema of its own is read as adopting it would (its versions whose
// objects exist).
func ReadStatus(ctx context.Context, db *sql.DB) (Status, error) {
	p, err := NewProvider(db)
	if err != nil {
		return Status{}, err
	}
	store, err := database.NewStore(database.DialectPostgres, TableName)
	if err != nil {
		return Status{}, fmt.Errorf("migrations: store: %w", err)
	}
	applied := map[int64]bool{}
	ext, ok := store.(database.StoreExtender)
	if !ok {
		return Status{}, errors.New("migrations: the postgres store cannot check for its table")
	}
	exists, err := ext.TableExists(ctx, db)
	if err != nil {
		return Status{}, fmt.Errorf("migrations: read the schema version: %w", err)
	}
	if exists {
		rows, err := store.ListMigrations(ctx, db)
		if err != nil {
			return Status{}, fmt.Errorf("migrations: read the schema version: %w", err)
		}
		// Newest first: a version's latest row says whether it is applied.
		for _, r := range rows {
			if _, seen := applied[r.Version]; !seen {
				applied[r.Version] = r.IsApplied
			}
		}
	} else {
		old, err := adoptableVersions(ctx, db)
		if err != nil {
			return Status{}, err
		}
		for _, v := range old {
			applied[v] = true
		}
	}
	st := Status{Pending: []int64{}}
	for v := range applied {
		if applied[v] && v > st.Current {
			st.Current = v
		}
	}
	for _, s := range p.ListSources() {
		st.Latest = max(st.Latest, s.Version)
		if !applied[s.Version] {
			st.Pending = append(st.Pending, s.Version)
		}
	}
	return st, nil
}
