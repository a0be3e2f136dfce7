package cli

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/spf13/cobra"

	"github.com/pgrelay/pgrelay/internal/pgurl"
	"github.com/pgrelay/pgrelay/internal/pooler"
	"github.com/pgrelay/pgrelay/migrations"
)

// MigrateCommand returns the `migrate` subcommand (up, down, status, sql) over the
// embedded migrations. dbs is read when the command runs: with several
// databases, --database names the one to migrate, and the output names it.
func MigrateCommand(dbs pgurl.Databases) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply, roll back, list or print the database migrations",
		Long: `Apply, roll back, list or print pgrelay's database migrations.

The migrations are embedded in the binary. Every pgrelay object lives in the
schema pgrelay, and the applied versions in pgrelay.goose_db_version. A
session-level advisory lock makes concurrent runs safe: each migration is
applied exactly once. The same files work with the goose CLI:
  psql "$DATABASE_URL" -c 'CREATE SCHEMA IF NOT EXISTS pgrelay'
  goose -dir migrations -table pgrelay.goose_db_version postgres "$DATABASE_URL" up`,
	}
	var force bool
	var database, prefix string
	cmd.PersistentFlags().StringVar(&database, strings.TrimPrefix(pgurl.DatabaseFlag, "--"), "",
		"the database to migrate, by name, when several are given (relay: --database-url repeated, --databases-file)")
	run := func(f func(ctx context.Context, p *goose.Provider) error) func(*cobra.Command, []string) error {
		return func(cmd *cobra.Command, _ []string) error {
			list, err := dbs()
			if err != nil {
				return err
			}
			target, err := pgurl.Pick(list, database)
			if err != nil {
				return err
			}
			prefix = ""
			if len(list) > 1 {
				prefix = "database " + target.Name + ": "
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Minute)
			defer cancel()
			pool, err := openMigrationPool(ctx, target.URL, force)
			if err != nil {
				return err
			}
			defer pool.Close()
			db := stdlib.OpenDBFromPool(pool)
			defer db.Close()
			p, err := migrations.NewProvider(db)
			if err != nil {
				return err
			}
			return f(ctx, p)
		}
	}
	out := func(cmd *cobra.Command, results []*goose.MigrationResult) {
		for _, r := range results {
			fmt.Fprintln(cmd.OutOrStdout(), prefix+r.String())
		}
		if len(results) == 0 {
			fmt.Fprintln(cmd.OutOrStdout(), prefix+"no migrations to run")
		}
	}
	up := &cobra.Command{Use: "up", Short: "Apply every pending migration", Args: cobra.NoArgs}
	up.RunE = run(func(ctx context.Context, p *goose.Provider) error {
		res, err := p.Up(ctx)
		out(up, res)
		return MigrateError("up", err)
	})
	down := &cobra.Command{Use: "down", Short: "Roll back the most recent migration", Args: cobra.NoArgs,
		Long: `Roll back the most recent migration.

A migration whose rollback would drop data (outbox events not yet published or
dead, inbox events, ledger entries, the replay audit trail, demo orders)
refuses while its table holds any; --force drops them anyway. The refusal is
in the migration's SQL, so the goose CLI gets it too; there the override is
PGOPTIONS="-c pgrelay.force_down=on".`}
	down.Flags().BoolVar(&force, "force", false, "roll back even when it drops rows (sets pgrelay.force_down=on)")
	down.RunE = run(func(ctx context.Context, p *goose.Provider) error {
		res, err := p.Down(ctx)
		if res != nil {
			out(down, []*goose.MigrationResult{res})
		}
		return MigrateError("down", err)
	})
	status := &cobra.Command{Use: "status", Short: "List migrations and whether each is applied", Args: cobra.NoArgs}
	status.RunE = run(func(ctx context.Context, p *goose.Provider) error {
		sts, err := p.Status(ctx)
		if err != nil {
			return err
		}
		for _, s := range sts {
			applied := "pending"
			if s.State == goose.StateApplied {
				applied = "applied " + s.AppliedAt.Format(time.RFC3339)
			}
			fmt.Fprintf(status.OutOrStdout(), "%s%-6d %-40s %s\n", prefix, s.Source.Version, s.Source.Path, applied)
		}
		return nil
	})
	cmd.AddCommand(up, down, status, sqlCommand())
	return cmd
}

// sqlCommand returns `migrate sql`, which prints the migrations' SQL and
// needs no database.
func sqlCommand() *cobra.Command {
	var opts migrations.SQLOptions
	var adopt bool
	c := &cobra.Command{
		Use:   "sql",
		Short: "Print the SQL of the migrations, for a migration tool of your own",
		Long: `Print the SQL of pgrelay's migrations, for teams that apply migrations with a
tool of their own: the up parts (or with --down the down parts, newest first)
of every version, or of those from --from to --to (both included). Each
migration is followed by the statement that records its version in
pgrelay.goose_db_version, as goose does, so that relay and consumer find the
schema migrated; the up output begins by creating the schema pgrelay and that
table. Run each migration in a transaction of its own: its first statement
sets the search_path for that transaction only.

--adopt prints only the statement that creates the schema pgrelay and adopts
the versions of an installation made before pgrelay had a schema of its own
(they were recorded in public.goose_db_version): run it once before upgrading
such an installation with the goose CLI. relay|consumer migrate up runs it
itself. See docs/schema.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if adopt {
				if opts.Down || opts.From != 0 || opts.To != 0 {
					return errors.New("--adopt prints the adoption statement only: it takes no --down, --from or --to")
				}
				_, err := fmt.Fprintln(cmd.OutOrStdout(), migrations.AdoptSQL+";")
				return err
			}
			return migrations.WriteSQL(cmd.OutOrStdout(), opts)
		},
	}
	c.Flags().BoolVar(&opts.Down, "down", false, "print the down parts, newest first")
	c.Flags().Int64Var(&opts.From, "from", 0, "the first version to print (0: the oldest)")
	c.Flags().Int64Var(&opts.To, "to", 0, "the last version to print (0: the newest)")
	c.Flags().BoolVar(&adopt, "adopt", false, "print only the statement adopting an older installation's versions")
	return c
}

// openMigrationPool connects for migrating: TCP keepalives as the services
// have them, but no statement or idle in transaction timeout, since a
// migration may rewrite a large table.
// With force, rollbacks that drop data go ahead (pgrelay.force_down=on, read
// by the down sections of the migrations).
func openMigrationPool(ctx context.Context, databaseURL string, force bool) (*pgxpool.Pool, error) {
	cfg, err := pgurl.Parse(databaseURL)
	if err != nil {
		return nil, fmt.Errorf(pgurl.DatabaseURLSetting+": %w", err)
	}
	if cfg.MaxConns < 2 {
		cfg.MaxConns = 2
	}
	DBSettings{IdleInTransactionTimeout: -1, TCPKeepalive: DefaultTCPKeepalive}.Apply(cfg)
	if force {
		cfg.ConnConfig.RuntimeParams["pgrelay.force_down"] = "on"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf(pgurl.DatabaseURLSetting+": %w", err)
	}
	if err := checkDirect(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// checkDirect refuses a connection through a connection pooler: migrating
// holds a session advisory lock and runs each migration in one session,
// which a pooler in transaction mode would spread over server connections
// (and could leave the lock held on one of them).
func checkDirect(ctx context.Context, pool *pgxpool.Pool) error {
	const direct = "migrations need a direct connection to PostgreSQL, not one through a connection pooler: give " + pgurl.DatabaseURLSetting + " the server's own address (see docs/pooler.md)"
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := pool.Acquire(ctx)
	if err != nil {
		if r := pooler.Refused(err, direct); r != nil {
			return r
		}
		return fmt.Errorf(pgurl.DatabaseURLSetting+": cannot reach PostgreSQL: %w", err)
	}
	defer c.Release()
	behind, err := pooler.Behind(ctx, c.Conn())
	if err != nil {
		return fmt.Errorf(pgurl.DatabaseURLSetting+": %w", err)
	}
	if behind {
		return fmt.Errorf("%s; the server process serving this connection is not the one named at start-up, as behind a pooler", direct)
	}
	return nil
}

// MigrateUp applies every pending migration over a connection of its own
// (see openMigrationPool); the services' --migrate runs it at start-up.
func MigrateUp(ctx context.Context, databaseURL string) error {
	pool, err := openMigrationPool(ctx, databaseURL, false)
	if err != nil {
		return err
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	return MigrateError("up", migrations.Up(ctx, db))
}

// MigrateError turns goose's "partial migration error (type:sql,version:N):
// ..." into a message that says what happened. A rollback a migration
// refused (its down section raises SQLSTATE 2BP01 "migrate down: ... would
// drop data ...") becomes "migrate down refused: <file> was not rolled back,
// nothing was changed ...: <why, and how to override>"; any other failure
// names the migration that failed, the ones applied before it, and that the
// failed one's own changes were undone (each runs in one transaction).
func MigrateError(op string, err error) error {
	var pe *goose.PartialError
	if !errors.As(err, &pe) || pe.Failed == nil || pe.Failed.Source == nil {
		return err
	}
	name := filepath.Base(pe.Failed.Source.Path)
	var pgErr *pgconn.PgError
	// 2BP01: dependent_objects_still_exist, what the down sections raise.
	if op == "down" && errors.As(pe.Err, &pgErr) && pgErr.Code == "2BP01" &&
		strings.HasPrefix(pgErr.Message, "migrate down: ") {
		return fmt.Errorf("migrate down refused: %s was not rolled back, nothing was changed (the schema stays at version %d): %s",
			name, pe.Failed.Source.Version, strings.TrimPrefix(pgErr.Message, "migrate down: "))
	}
	done := ""
	if len(pe.Applied) > 0 {
		names := make([]string, len(pe.Applied))
		for i, r := range pe.Applied {
			names[i] = filepath.Base(r.Source.Path)
		}
		done = fmt.Sprintf(" after %s succeeded (%s)", strings.Join(names, ", "), map[string]string{"up": "applied", "down": "rolled back"}[op])
	}
	return fmt.Errorf("migrate %s: %s failed%s; its own changes were undone (one transaction): %w", op, name, done, pe.Err)
}
