package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/migrations"
)

// TestCheck: a fully migrated database passes; one migration rolled back is
// reported with the current, required and pending versions; an empty
// database is reported as not migrated, and checking it creates nothing.
func TestCheck(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	pool := testdb.New(t)
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	require.NoError(t, migrations.Check(ctx, db))

	p, err := migrations.NewProvider(db)
	require.NoError(t, err)
	sources := p.ListSources()
	last := sources[len(sources)-1].Version
	_, err = p.Down(ctx)
	require.NoError(t, err)
	var se *migrations.SchemaError
	require.ErrorAs(t, migrations.Check(ctx, db), &se)
	require.Equal(t, []int64{last}, se.Pending)
	require.Equal(t, last, se.Required)
	require.Equal(t, sources[len(sources)-2].Version, se.Current)
	require.ErrorContains(t, se, fmt.Sprintf("at version %d, this build needs version %d", se.Current, last))

	empty, err := pgxpool.New(ctx, testdb.EmptyURL(t))
	require.NoError(t, err)
	defer empty.Close()
	edb := stdlib.OpenDBFromPool(empty)
	defer edb.Close()
	err = migrations.Check(ctx, edb)
	require.True(t, errors.As(err, &se) && se.Current == 0 && len(se.Pending) == len(sources), "%v", err)
	require.ErrorContains(t, err, "not migrated")
	var exists bool
	require.NoError(t, empty.QueryRow(ctx, `SELECT to_regnamespace('pgrelay') IS NOT NULL OR to_regclass('goose_db_version') IS NOT NULL`).Scan(&exists))
	require.False(t, exists, "the check only reads: no schema, no version table")
}

// TestStatusRequire: a database one migration behind reads as behind, with
// the version rolled back pending; it meets a minimum up to the version
// before, and a minimum at the rolled-back version reports both versions.
func TestStatusRequire(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	db := stdlib.OpenDBFromPool(testdb.New(t))
	defer db.Close()
	st, err := migrations.ReadStatus(ctx, db)
	require.NoError(t, err)
	require.False(t, st.Behind())
	require.Equal(t, st.Latest, st.Current)
	require.Empty(t, st.Pending)

	p, err := migrations.NewProvider(db)
	require.NoError(t, err)
	sources := p.ListSources()
	last, before := sources[len(sources)-1].Version, sources[len(sources)-2].Version
	_, err = p.Down(ctx)
	require.NoError(t, err)
	st, err = migrations.ReadStatus(ctx, db)
	require.NoError(t, err)
	require.Equal(t, migrations.Status{Current: before, Latest: last, Pending: []int64{last}}, st)
	require.True(t, st.Behind())
	require.NoError(t, st.Require(before))
	var se *migrations.SchemaError
	require.ErrorAs(t, st.Require(last), &se)
	require.ErrorAs(t, st.Require(0), &se)
	require.Equal(t, last, se.Minimum)
	require.EqualError(t, st.Require(0), fmt.Sprintf("database schema is at version %d, this build needs version %d (pending: %d)", before, last, last))
	low := migrations.Status{Current: sources[0].Version, Latest: last, Pending: []int64{before, last}}
	require.EqualError(t, low.Require(before), fmt.Sprintf("database schema is at version %d, this build needs version %d at least (latest %d; pending: %d, %d)",
		sources[0].Version, before, last, before, last))
}
