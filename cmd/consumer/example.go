package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/spf13/cobra"

	ledgermigrations "github.com/pgrelay/pgrelay/internal/ledger/migrations"
)

// addExampleSchemaFlag gives `migrate up` the --example-schema flag: after
// pgrelay's migrations it applies the worked example's schema (the ledger the
// ledger handler credits and the demo shop), which pgrelay's own migrations
// no longer create in a user's database.
func addExampleSchemaFlag(migrate *cobra.Command, databaseURL *string) {
	for _, up := range migrate.Commands() {
		if up.Name() != "up" {
			continue
		}
		var example bool
		up.Flags().BoolVar(&example, "example-schema", false,
			"also apply the example schema the ledger handler needs (ledger_orders, ledger_entries, shop_orders; goose table "+ledgermigrations.TableName+")")
		product := up.RunE
		up.RunE = func(cmd *cobra.Command, args []string) error {
			if err := product(cmd, args); err != nil {
				return err
			}
			if !example {
				return nil
			}
			return migrateExampleSchema(cmd, *databaseURL)
		}
	}
}

func migrateExampleSchema(cmd *cobra.Command, databaseURL string) error {
	if databaseURL == "" {
		return errors.New("--database-url (DATABASE_URL) is required")
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		return fmt.Errorf("--database-url (DATABASE_URL): %w", err)
	}
	defer pool.Close()
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	p, err := ledgermigrations.NewProvider(sqlDB)
	if err != nil {
		return err
	}
	res, err := p.Up(ctx)
	for _, r := range res {
		fmt.Fprintln(cmd.OutOrStdout(), "example schema:", r.String())
	}
	if err == nil && len(res) == 0 {
		fmt.Fprintln(cmd.OutOrStdout(), "example schema: no migrations to run")
	}
	if err != nil {
		return fmt.Errorf("example schema: %w", err)
	}
	return nil
}

// checkExampleSchema fails start-up when the ledger handler's tables are
// missing, saying how to create them: every event would otherwise fail in
// the handler and go dead after its attempts.
func checkExampleSchema(ctx context.Context, pool *pgxpool.Pool) error {
	if err := ledgermigrations.Check(ctx, pool); err != nil {
		return fmt.Errorf("--database-url (DATABASE_URL): %w", err)
	}
	return nil
}
