package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/spf13/cobra"

	"github.com/pgrelay/pgrelay/internal/cli"
	ledgermigrations "github.com/pgrelay/pgrelay/internal/ledger/migrations"
	"github.com/pgrelay/pgrelay/internal/pgurl"
)

// addExampleSchemaFlag gives `migrate up`, `down` and `status` the
// --example-schema flag, for the worked example's schema (the ledger the
// ledger handler credits and the demo shop), which pgrelay's own migrations
// no longer create in a user's database: up applies it after pgrelay's
// migrations, down rolls back its most recent migration instead of
// pgrelay's, status lists it after pgrelay's.
func addExampleSchemaFlag(migrate *cobra.Command, databaseURL *string, urlName string) {
	for _, sub := range migrate.Commands() {
		name := sub.Name()
		if name != "up" && name != "down" && name != "status" {
			continue
		}
		var example bool
		help := map[string]string{
			"up":     "also apply the example schema the ledger handler needs (ledger_orders, ledger_entries, shop_orders; goose table " + ledgermigrations.TableName + ")",
			"down":   "roll back the example schema's most recent migration instead of pgrelay's",
			"status": "also list the example schema's migrations",
		}[name]
		sub.Flags().BoolVar(&example, "example-schema", false, help)
		product := sub.RunE
		sub.RunE = func(cmd *cobra.Command, args []string) error {
			if !example {
				return product(cmd, args)
			}
			if name != "down" {
				if err := product(cmd, args); err != nil {
					return err
				}
			}
			return runExampleSchema(cmd, name, *databaseURL, urlName)
		}
	}
}

func runExampleSchema(cmd *cobra.Command, op, databaseURL, urlName string) error {
	if databaseURL == "" {
		return errors.New(urlName + " is required")
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Minute)
	defer cancel()
	cfg, err := pgurl.Parse(databaseURL)
	if err != nil {
		return fmt.Errorf("%s: %w", urlName, err)
	}
	if force, _ := cmd.Flags().GetBool("force"); force {
		cfg.ConnConfig.RuntimeParams["pgrelay.force_down"] = "on"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("%s: %w", urlName, err)
	}
	defer pool.Close()
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	p, err := ledgermigrations.NewProvider(sqlDB)
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	switch op {
	case "up":
		res, err := p.Up(ctx)
		for _, r := range res {
			fmt.Fprintln(out, "example schema:", r.String())
		}
		if err != nil {
			return fmt.Errorf("example schema: %w", cli.MigrateError("up", err))
		}
		if len(res) == 0 {
			fmt.Fprintln(out, "example schema: no migrations to run")
		}
	case "down":
		res, err := p.Down(ctx)
		if res != nil {
			fmt.Fprintln(out, "example schema:", res.String())
		}
		if err != nil {
			return fmt.Errorf("example schema: %w", cli.MigrateError("down", err))
		}
	case "status":
		sts, err := p.Status(ctx)
		if err != nil {
			return fmt.Errorf("example schema: %w", err)
		}
		for _, s := range sts {
			applied := "pending"
			if s.State == goose.StateApplied {
				applied = "applied " + s.AppliedAt.Format(time.RFC3339)
			}
			fmt.Fprintf(out, "%-6d %-40s %s\n", s.Source.Version, "example/"+s.Source.Path, applied)
		}
	}
	return nil
}

// checkExampleSchema fails start-up when the ledger handler's tables are
// missing, saying how to create them: every event would otherwise fail in
// the handler and go dead after its attempts. A database without pgrelay's
// schema either is left to the consumer's start-up check, which says how to
// migrate it first.
func checkExampleSchema(ctx context.Context, pool *pgxpool.Pool, urlName string) error {
	err := ledgermigrations.Check(ctx, pool)
	if missing := (*ledgermigrations.MissingError)(nil); errors.As(err, &missing) && missing.NoPgrelay {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: %w", urlName, err)
	}
	return nil
}
