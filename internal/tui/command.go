package tui

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"strings"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/admin"
	"github.com/pgrelay/pgrelay/internal/cli"
	"github.com/pgrelay/pgrelay/internal/pgurl"
	"github.com/pgrelay/pgrelay/internal/pooler"
)

// EnvKinds lists the typed environment variables the tui command reads, for
// cli.ValidateEnv.
var EnvKinds = map[string]string{"DEDUP_WINDOW": "duration", "DEDUP_RECORD_MAX": "int", "TUI_REFRESH": "duration"}

// Command returns the "tui" subcommand of service ("relay" or "consumer"). It
// connects to each database of dbs (read when it runs) and shows them all.
func Command(service string, dbs pgurl.Databases) *cobra.Command {
	var (
		refresh             time.Duration
		window              time.Duration
		recordMax           int
		metricsURL, natsURL string
		stream, actor, dir  string
	)
	cmd := &cobra.Command{
		Use:   "tui",
		Short: "Operator console: dedup, inbox keys, outbox partitions and tuning advice, live",
		Long: `Operator console in the terminal. Wide terminals show the dedup, keys and
config & tuning panels with the outbox below; narrow ones (80x24) show tabs
switched with 1-4. Press h for the keys. Purging a dead key (d) and resetting
the dedup counters (Ctrl+R) ask first and are recorded in the replay audit
table with --actor, like the CLI's operations. docs/console.md shows the
screens. Given several databases (relay: --database-url repeated,
--databases-file), a row shows each one's lag, pending and dead events; n and
p select the one the panels show and the operations act on.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.ValidateEnv(EnvKinds); err != nil {
				return err
			}
			list, err := dbs()
			if err != nil {
				return err
			}
			if window < pgrelay.MinDedupWindow {
				return fmt.Errorf("--dedup-window (DEDUP_WINDOW) must be at least %s, got %s", pgrelay.MinDedupWindow, window)
			}
			if refresh < 100*time.Millisecond {
				return fmt.Errorf("--refresh (TUI_REFRESH) must be at least 100ms, got %s", refresh)
			}
			if recordMax < 1 {
				return fmt.Errorf("--dedup-record-max (DEDUP_RECORD_MAX) must be at least 1, got %d", recordMax)
			}
			ctx := cmd.Context()
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			cfg := Config{
				Service: service, DedupWindow: window,
				DedupRecordMax: recordMax, Actor: actor, ExportDir: dir, Refresh: refresh,
			}
			var where []string
			for _, n := range list {
				if len(list) == 1 {
					n.Name = "" // nothing to tell apart
				}
				db, closeFn, err := openDatabase(cctx, n, window, recordMax)
				if err != nil {
					return err
				}
				defer closeFn()
				cfg.Databases = append(cfg.Databases, db)
				where = append(where, strings.TrimPrefix(n.Name+" ", " ")+redact(n.URL))
			}
			cfg.Settings = []Setting{
				{"database", strings.Join(where, ", ")},
				{"dedup window", fmtDur(window)},
				{"dedup record max", fmt.Sprint(recordMax)},
				{"refresh", refresh.String()},
				{"actor", actor},
			}
			if metricsURL != "" {
				cfg.Counters = admin.ScrapeCounters(ctx, metricsURL)
				cfg.Settings = append(cfg.Settings, Setting{"metrics", metricsURL})
			}
			if natsURL != "" {
				nc, err := nats.Connect(natsURL, nats.Timeout(5*time.Second), nats.MaxReconnects(-1))
				if err != nil {
					return fmt.Errorf("--nats-url (NATS_URL): %w", err)
				}
				defer nc.Close()
				js, err := jetstream.New(nc)
				if err != nil {
					return fmt.Errorf("--nats-url (NATS_URL): %w", err)
				}
				cfg.Stream = func(ctx context.Context) (*StreamInfo, error) {
					s, err := js.Stream(ctx, stream)
					if err != nil {
						return nil, fmt.Errorf("stream %s: %w", stream, err)
					}
					info := s.CachedInfo()
					return &StreamInfo{Name: info.Config.Name, MaxAge: info.Config.MaxAge,
						Duplicates: info.Config.Duplicates, Messages: info.State.Msgs}, nil
				}
				cfg.Settings = append(cfg.Settings, Setting{"stream", stream + " @ " + redact(natsURL)})
			}
			m, err := New(cfg)
			if err != nil {
				return err
			}
			p := tea.NewProgram(m, tea.WithAltScreen(), tea.WithContext(ctx),
				tea.WithInput(cmd.InOrStdin()), tea.WithOutput(cmd.OutOrStdout()))
			if _, err := p.Run(); err != nil && !errors.Is(err, tea.ErrProgramKilled) {
				return fmt.Errorf("console: %w", err)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.DurationVar(&refresh, "refresh", cli.EnvDuration("TUI_REFRESH", 2*time.Second), "how often the console reloads (env TUI_REFRESH)")
	f.DurationVar(&window, "dedup-window", cli.EnvDuration("DEDUP_WINDOW", pgrelay.DefaultDedupWindow), "the inbox's dedup window, as the consumer runs it: retention deadlines, advice and f (env DEDUP_WINDOW)")
	f.IntVar(&recordMax, "dedup-record-max", cli.EnvInt("DEDUP_RECORD_MAX", pgrelay.DefaultDuplicatesMax), "the duplicate record's cap, as the consumer runs it (env DEDUP_RECORD_MAX)")
	f.StringVar(&metricsURL, "metrics-url", "", "a consumer's /metrics URL, for its process counters (for example http://127.0.0.1:9090/metrics)")
	f.StringVar(&natsURL, "nats-url", "", "NATS server, to read the stream's MaxAge and duplicate window for the advice (NATS_URL is not read: pass it)")
	f.StringVar(&stream, "stream", cli.EnvString("CONSUMER_STREAM", "PGRELAY"), "the JetStream stream (env CONSUMER_STREAM)")
	f.StringVar(&actor, "actor", defaultActor(), "who operates (recorded in the audit table)")
	f.StringVar(&dir, "export-dir", ".", "where s writes the statistics JSON file")
	return cmd
}

// openDatabase connects to db and returns the console's Database for it,
// and what closes it.
func openDatabase(ctx context.Context, db pgurl.Named, window time.Duration, recordMax int) (Database, func(), error) {
	what := db.From
	if db.Name != "" {
		what = "database " + db.Name + " (" + db.From + ")"
	}
	pool, err := pooler.NewPool(ctx, db.URL)
	if err != nil {
		return Database{}, nil, fmt.Errorf("%s: %w", what, err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return Database{}, nil, fmt.Errorf("%s: %w", what, err)
	}
	svc, err := admin.New(admin.Config{Pool: pool, Database: db.Name, QueryTimeout: 10 * time.Second})
	if err == nil {
		var cleaner *pgrelay.InboxCleaner
		if cleaner, err = pgrelay.NewInboxCleaner(pool, pgrelay.InboxRetentionConfig{Window: window, DuplicatesMax: recordMax}, nil); err == nil {
			return Database{Name: db.Name, Admin: svc, Retention: cleaner.RunOnce}, pool.Close, nil
		}
	}
	pool.Close()
	return Database{}, nil, err
}

func defaultActor() string {
	name := os.Getenv("USER")
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	host, _ := os.Hostname()
	if name == "" {
		name = "unknown"
	}
	return "tui:" + name + "@" + host
}

// redact hides a URL's password.
func redact(u string) string {
	at := strings.LastIndex(u, "@")
	scheme := strings.Index(u, "://")
	if at < 0 || scheme < 0 || at < scheme {
		return u
	}
	cred := u[scheme+3 : at]
	if i := strings.Index(cred, ":"); i >= 0 {
		return u[:scheme+3] + cred[:i] + ":***" + u[at:]
	}
	return u
}
