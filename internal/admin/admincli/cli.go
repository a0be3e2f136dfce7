// Package admincli holds the operator subcommands both binaries carry; they
// call admin.Service, as the HTTP API does.
package admincli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgrelay/pgrelay/internal/admin"
	"github.com/pgrelay/pgrelay/internal/pgurl"
	"github.com/pgrelay/pgrelay/internal/pooler"
	"github.com/pgrelay/pgrelay/migrations"
)

// Commands returns the operator subcommands (stats, dead, outbox, audit,
// conflicts, gaps, wal). They connect to one of the databases dbs lists (read
// when a command runs): with several, the one --database names (stats
// without it: each), and name it in what they print. They call the same
// Service methods as the HTTP API. Output is a table, or JSON with --json.
func Commands(dbs pgurl.Databases) []*cobra.Command {
	c := &cliEnv{dbs: dbs}
	outbox := &cobra.Command{
		Use:   "outbox",
		Short: "Operate on the outbox (dead letters)",
	}
	outbox.AddCommand(c.deadCommand(admin.SourceOutbox))
	conflicts := &cobra.Command{
		Use:   "conflicts",
		Short: "List inbox key conflicts: the same dedup key delivered with a different payload",
	}
	conflicts.AddCommand(c.conflictsList())
	dead := c.deadCommand(admin.SourceInbox)
	dead.AddCommand(c.deadSkipCommand())
	cmds := []*cobra.Command{c.statsCommand(), dead, outbox, c.auditCommand(), conflicts, c.gapsCommand(), c.walCommand()}
	for _, cmd := range cmds {
		cmd.PersistentFlags().StringVar(&c.database, strings.TrimPrefix(pgurl.DatabaseFlag, "--"), "",
			"the database to act on, by name, when several are given (relay: --database-url repeated, --databases-file)")
	}
	return cmds
}

type cliEnv struct {
	dbs pgurl.Databases
	// database is --database.
	database string
}

// service opens the database --database names, or the only one.
func (c *cliEnv) service(ctx context.Context, counters func() (float64, float64, bool)) (*admin.Service, func(), error) {
	list, err := c.dbs()
	if err != nil {
		return nil, nil, err
	}
	db, err := pgurl.Pick(list, c.database)
	if err != nil {
		return nil, nil, err
	}
	if len(list) == 1 {
		db.Name = "" // one database: nothing to tell apart
	}
	return open(ctx, db, counters)
}

// prefix is "database NAME: " for a Service of one of several databases,
// which every line reporting a change starts with.
func prefix(svc *admin.Service) string {
	if svc.Database() == "" {
		return ""
	}
	return "database " + svc.Database() + ": "
}

// open connects to db (Name "" when it is the only one).
func open(ctx context.Context, db pgurl.Named, counters func() (float64, float64, bool)) (*admin.Service, func(), error) {
	url, setting := db.URL, db.From
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pool, err := pooler.NewPool(cctx, url)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", setting, err)
	}
	if err := pool.Ping(cctx); err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("%s: %w", setting, err)
	}
	svc, err := admin.New(admin.Config{Pool: pool, Database: db.Name, Counters: counters})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return svc, pool.Close, nil
}

// run wraps a command body with the service's set-up and tear-down.
func (c *cliEnv) run(f func(cmd *cobra.Command, args []string, svc *admin.Service) error) func(*cobra.Command, []string) error {
	return c.runWith(nil, f)
}

// runWith is run with the service's dedup counters read from the /metrics
// URL *metricsURL, when it is set.
func (c *cliEnv) runWith(metricsURL *string, f func(cmd *cobra.Command, args []string, svc *admin.Service) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		var counters func() (float64, float64, bool)
		if metricsURL != nil && *metricsURL != "" {
			counters = admin.ScrapeCounters(cmd.Context(), *metricsURL)
		}
		svc, closeFn, err := c.service(cmd.Context(), counters)
		if err != nil {
			return err
		}
		defer closeFn()
		return f(cmd, args, svc)
	}
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func (c *cliEnv) statsCommand() *cobra.Command {
	var asJSON bool
	var metricsURL string
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Show inbox and outbox counts by status, table sizes, lag and dedup hit rate",
		Long: `Show inbox and outbox counts by status, table sizes, the oldest pending
events, the consumer's lag (the oldest inbox event ready to run) and the
relay's lag (the oldest outbox row waiting to be published). The dedup hit rate comes from a
running consumer's counters: pass its metrics endpoint with --metrics-url.
Given several databases and no --database, the stats of each.`,
		Args: cobra.NoArgs,
	}
	cmd.RunE = c.runWith(&metricsURL, func(cmd *cobra.Command, _ []string, svc *admin.Service) error {
		st, err := svc.Stats(cmd.Context())
		if err != nil {
			return err
		}
		if asJSON {
			return printJSON(cmd.OutOrStdout(), st)
		}
		return writeStats(cmd.OutOrStdout(), st)
	})
	run := cmd.RunE
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		list, err := c.dbs()
		if err != nil {
			return err
		}
		if len(list) == 1 || c.database != "" {
			return run(cmd, args)
		}
		return statsEach(cmd, list, asJSON)
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	cmd.Flags().StringVar(&metricsURL, "metrics-url", "", "a consumer's /metrics URL, for the dedup hit rate (for example http://127.0.0.1:9090/metrics)")
	return cmd
}

// statsEach prints the stats of each database of named, headed by its name
// (JSON: a list of {"database", "stats"}).
func statsEach(cmd *cobra.Command, named []pgurl.Named, asJSON bool) error {
	type one struct {
		Database string       `json:"database"`
		Stats    *admin.Stats `json:"stats"`
	}
	var all []one
	for _, n := range named {
		svc, closeFn, err := open(cmd.Context(), n, nil)
		if err != nil {
			return fmt.Errorf("database %s: %w", n.Name, err)
		}
		st, err := svc.Stats(cmd.Context())
		closeFn()
		if err != nil {
			return fmt.Errorf("database %s: %w", n.Name, err)
		}
		all = append(all, one{n.Name, st})
	}
	if asJSON {
		return printJSON(cmd.OutOrStdout(), all)
	}
	for i, o := range all {
		if i > 0 {
			fmt.Fprintln(cmd.OutOrStdout())
		}
		fmt.Fprintf(cmd.OutOrStdout(), "== %s\n", o.Database)
		if err := writeStats(cmd.OutOrStdout(), o.Stats); err != nil {
			return err
		}
	}
	return nil
}

func writeStats(w io.Writer, st *admin.Stats) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "INBOX\tVALUE")
	for _, status := range admin.InboxStatuses {
		fmt.Fprintf(tw, "%s\t%d\n", status, st.Inbox.ByStatus[status])
	}
	for _, h := range st.Inbox.Handlers {
		fmt.Fprintf(tw, "handler %s (%s)\t", h.Handler, strings.Join(h.KeyStrategies, ", "))
		for i, status := range admin.InboxStatuses {
			if i > 0 {
				fmt.Fprint(tw, ", ")
			}
			fmt.Fprintf(tw, "%s %d", status, h.ByStatus[status])
		}
		fmt.Fprintln(tw)
	}
	fmt.Fprintf(tw, "table size\t%s\n", admin.HumanBytes(st.Inbox.TableBytes))
	fmt.Fprintf(tw, "oldest pending\t%s\n", secs(st.Inbox.OldestPendingSeconds))
	fmt.Fprintf(tw, "lag (oldest claimable)\t%s\n", secs(st.Inbox.OldestClaimableSeconds))
	if st.Dedup != nil {
		fmt.Fprintf(tw, "dedup hit rate\t%.2f%% (%.0f of %.0f deliveries)\n", st.Dedup.HitRate*100, st.Dedup.Duplicates, st.Dedup.Received)
	} else {
		fmt.Fprintf(tw, "dedup hit rate\tunknown (pass --metrics-url)\n")
	}
	writeOrderedStats(tw, st.Ordered)
	fmt.Fprintln(tw, "\t")
	fmt.Fprintln(tw, "OUTBOX\tVALUE")
	for _, status := range admin.OutboxStatuses {
		fmt.Fprintf(tw, "%s\t%d\n", status, st.Outbox.ByStatus[status])
	}
	fmt.Fprintf(tw, "table size\t%s\n", admin.HumanBytes(st.Outbox.TableBytes))
	fmt.Fprintf(tw, "lag (oldest pending)\t%s\n", secs(st.Outbox.OldestPendingSeconds))
	for _, w := range st.WALSlots {
		safe := "unlimited"
		if w.SafeWALSizeBytes != nil {
			safe = admin.HumanBytes(*w.SafeWALSizeBytes)
		}
		fmt.Fprintf(tw, "WAL slot %s\t%s, active %t, lag %s, %s before lost\n", w.Slot, w.WALStatus, w.Active, admin.HumanBytes(w.LagBytes), safe)
	}
	fmt.Fprintln(tw, "\t")
	fmt.Fprintf(tw, "audit table size\t%s\n", admin.HumanBytes(st.AuditTableBytes))
	fmt.Fprintf(tw, "schema version\t%s\n", schemaLine(st.Schema))
	return tw.Flush()
}

// schemaLine is a schema's version, and the migrations pending when it is
// behind.
func schemaLine(s migrations.Status) string {
	if !s.Behind() {
		return fmt.Sprintf("%d (latest)", s.Current)
	}
	pending := make([]string, len(s.Pending))
	for i, v := range s.Pending {
		pending[i] = strconv.FormatInt(v, 10)
	}
	return fmt.Sprintf("%d, behind latest %d (pending: %s)", s.Current, s.Latest, strings.Join(pending, ", "))
}

func secs(s float64) string {
	return (time.Duration(s * float64(time.Second))).Round(time.Millisecond).String()
}

// filterFlags binds the dead-letter filter flags.
type filterFlags struct {
	handler, topic, eventType, key, errorContains, since, until string
	limit                                                       int
}

func (ff *filterFlags) bind(cmd *cobra.Command) {
	cmd.Flags().StringVar(&ff.handler, "handler", "", "only rows of this named handler (inbox; each handler keeps its own dead letters)")
	cmd.Flags().StringVar(&ff.topic, "topic", "", "only events of this topic")
	cmd.Flags().StringVar(&ff.eventType, "type", "", "only events of this event type")
	cmd.Flags().StringVar(&ff.key, "key", "", "only events with this key")
	cmd.Flags().StringVar(&ff.errorContains, "error", "", "only events whose error contains this text (case-insensitive)")
	cmd.Flags().StringVar(&ff.since, "since", "", "only events that went dead at or after this time (RFC 3339, or a duration ago such as 24h)")
	cmd.Flags().StringVar(&ff.until, "until", "", "only events that went dead before this time (RFC 3339, or a duration ago)")
	cmd.Flags().IntVar(&ff.limit, "limit", 0, "at most this many events (default and maximum: 1000)")
}

func (ff *filterFlags) filter(now time.Time) (admin.Filter, error) {
	f := admin.Filter{Handler: ff.handler, Topic: ff.topic, EventType: ff.eventType, Key: ff.key, ErrorContains: ff.errorContains, Limit: ff.limit}
	for _, p := range []struct {
		flag, v string
		dst     **time.Time
	}{{"--since", ff.since, &f.DeadAfter}, {"--until", ff.until, &f.DeadBefore}} {
		if p.v == "" {
			continue
		}
		t, err := parseWhen(p.v, now)
		if err != nil {
			return f, fmt.Errorf("%s %q: want an RFC 3339 time or a duration ago (24h)", p.flag, p.v)
		}
		*p.dst = &t
	}
	if ff.limit < 0 {
		return f, fmt.Errorf("--limit %d: must not be negative", ff.limit)
	}
	return f, nil
}

func parseWhen(v string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return time.Time{}, err
	}
	return now.Add(-d), nil
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
	return "cli:" + name + "@" + host
}

func (c *cliEnv) deadCommand(src admin.Source) *cobra.Command {
	dead := &cobra.Command{
		Use:   "dead",
		Short: fmt.Sprintf("List, show, requeue or purge dead %s events", src),
	}
	dead.AddCommand(c.deadList(src), c.deadShow(src), c.deadRequeue(src), c.deadPurge(src))
	return dead
}

func (c *cliEnv) deadList(src admin.Source) *cobra.Command {
	var ff filterFlags
	var asJSON bool
	cmd := &cobra.Command{Use: "list", Short: fmt.Sprintf("List dead %s events, oldest first", src), Args: cobra.NoArgs}
	ff.bind(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	cmd.RunE = c.run(func(cmd *cobra.Command, _ []string, svc *admin.Service) error {
		f, err := ff.filter(time.Now())
		if err != nil {
			return err
		}
		list, err := svc.ListDead(cmd.Context(), src, f)
		if err != nil {
			return err
		}
		if asJSON {
			return printJSON(cmd.OutOrStdout(), list)
		}
		tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
		if src == admin.SourceInbox {
			fmt.Fprintln(tw, "HANDLER\tEVENT_ID\tTOPIC\tTYPE\tATTEMPTS\tDEAD_AT\tERROR")
		} else {
			fmt.Fprintln(tw, "EVENT_ID\tTOPIC\tTYPE\tATTEMPTS\tDEAD_AT\tERROR")
		}
		for _, d := range list {
			if src == admin.SourceInbox {
				fmt.Fprintf(tw, "%s\t", d.Handler)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", d.EventID, d.Topic, d.EventType, d.Attempts,
				timeOrDash(d.DeadAt), oneLine(d.LastError, 80))
		}
		return tw.Flush()
	})
	return cmd
}

func timeOrDash(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

func (c *cliEnv) deadShow(src admin.Source) *cobra.Command {
	var asJSON bool
	var handler string
	cmd := &cobra.Command{Use: "show EVENT_ID", Short: fmt.Sprintf("Show one %s event with its payload and error", src), Args: cobra.ExactArgs(1)}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	if src == admin.SourceInbox {
		cmd.Flags().StringVar(&handler, "handler", "", "the named handler's row (an event has one per handler that stored it)")
	}
	cmd.RunE = c.run(func(cmd *cobra.Command, args []string, svc *admin.Service) error {
		d, err := svc.Show(cmd.Context(), src, args[0], handler)
		if err != nil {
			return err
		}
		if asJSON {
			return printJSON(cmd.OutOrStdout(), d)
		}
		tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
		row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
		row("event_id", d.EventID)
		if d.Source == admin.SourceInbox {
			row("handler", d.Handler)
			row("dedup_key", d.DedupKey)
			row("key_strategy", d.KeyStrategy)
			if len(d.OtherHandlers) > 0 {
				row("other handlers", strings.Join(d.OtherHandlers, ", ")+" (show them with --handler)")
			}
		}
		row("status", d.Status)
		row("topic", d.Topic)
		row("key", d.Key)
		row("event_type", d.EventType)
		row("attempts", fmt.Sprint(d.Attempts))
		if d.Source == admin.SourceOutbox {
			row("id", fmt.Sprint(d.ID))
			row("partition", fmt.Sprint(d.Partition))
			row("created_at", timeOrDash(d.CreatedAt))
		} else {
			row("received_at", timeOrDash(d.ReceivedAt))
		}
		row("finished_at", timeOrDash(d.DeadAt))
		row("last_error", d.LastError)
		keys := make([]string, 0, len(d.Headers))
		for k := range d.Headers {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			row("header "+k, d.Headers[k])
		}
		row("payload ("+d.PayloadEncoding+")", d.Payload)
		return tw.Flush()
	})
	return cmd
}

// writeResult prints a requeue's or purge's result as a table, or as JSON;
// the lines saying what changed, or would change, start with prefix.
func writeResult(w io.Writer, res *admin.Result, asJSON bool, prefix string) error {
	if asJSON {
		return printJSON(w, res)
	}
	verb := map[string]string{"requeue": "requeued", "purge": "purged"}[res.Action]
	if res.DryRun {
		fmt.Fprintf(w, "%sdry run: would have %s %d dead %s event(s); nothing changed\n", prefix, verb, res.Count, res.Source)
	} else {
		fmt.Fprintf(w, "%s%s %d dead %s event(s)\n", prefix, verb, res.Count, res.Source)
	}
	if res.Count > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "EVENT_ID\tPREVIOUS_ATTEMPTS\tPREVIOUS_ERROR")
		for _, e := range res.Events {
			fmt.Fprintf(tw, "%s\t%d\t%s\n", e.EventID, e.PreviousAttempts, oneLine(e.PreviousError, 80))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if res.More {
		fmt.Fprintf(w, "the limit of %d was reached: more events may match; run the command again\n", res.Limit)
	}
	if res.Confirm != "" {
		fmt.Fprintf(w, "%sto %s exactly these, run the same command without --dry-run and with --confirm %s (until %s)\n",
			prefix, res.Action, res.Confirm, res.ConfirmExpires.UTC().Format(time.RFC3339))
	}
	return nil
}

func (c *cliEnv) deadRequeue(src admin.Source) *cobra.Command {
	var ff filterFlags
	var asJSON, dryRun, all bool
	var actor, reason, confirm string
	cmd := &cobra.Command{
		Use:   "requeue [EVENT_ID]",
		Short: fmt.Sprintf("Put dead %s events back to pending (same event id, attempts reset), audited", src),
		Long: fmt.Sprintf(`Put dead %s events back to pending with the same event id and their attempts
reset. Give one EVENT_ID, or a filter (--topic, --type, --error, --since,
--until), or --all. Every requeued event is recorded in the replay_audit table
with --actor and --reason. --dry-run shows what would be requeued and changes
nothing; its --confirm token, given to the same command, requeues exactly the
events it showed, or nothing when they changed or the token expired (10m).`, src),
		Args: cobra.MaximumNArgs(1),
	}
	ff.bind(cmd)
	cmd.Flags().BoolVar(&all, "all", false, "requeue every dead event when no filter is given (up to --limit)")
	cmd.Flags().StringVar(&reason, "reason", "", "why the events are requeued (required; recorded in the audit table)")
	cmd.Flags().StringVar(&actor, "actor", defaultActor(), "who requeues (recorded in the audit table)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "show what would be requeued; change nothing")
	cmd.Flags().StringVar(&confirm, "confirm", "", "the token a --dry-run printed: requeue exactly the events it showed, or nothing")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	cmd.RunE = c.run(func(cmd *cobra.Command, args []string, svc *admin.Service) error {
		f, err := ff.filter(time.Now())
		if err != nil {
			return err
		}
		if len(args) == 1 {
			f.EventID = args[0]
		}
		if reason == "" {
			return errors.New("--reason is required: say why the events are requeued (it is recorded in the audit table)")
		}
		res, err := svc.Requeue(cmd.Context(), src, admin.RequeueRequest{Filter: f, All: all, Actor: actor, Reason: reason, DryRun: dryRun, Confirm: confirm})
		if err != nil {
			return err
		}
		return writeResult(cmd.OutOrStdout(), res, asJSON, prefix(svc))
	})
	return cmd
}

func (c *cliEnv) deadPurge(src admin.Source) *cobra.Command {
	var ff filterFlags
	var asJSON, dryRun bool
	var actor, reason, confirm string
	var olderThan time.Duration
	cmd := &cobra.Command{
		Use:   "purge --older-than DURATION",
		Short: fmt.Sprintf("Delete dead %s events older than a duration, audited", src),
		Long: fmt.Sprintf(`Delete dead %s events that have been dead for at least --older-than
(further narrowed by the filter flags). Every purged event is recorded in the
replay_audit table. A purged inbox event no longer deduplicates: a later
redelivery of it is received as new. --dry-run shows what would be deleted and
changes nothing; its --confirm token, given to the same command, purges exactly
the events it showed, or nothing when they changed or the token expired (10m).`, src),
		Args: cobra.NoArgs,
	}
	ff.bind(cmd)
	cmd.Flags().DurationVar(&olderThan, "older-than", 0, "only events dead for at least this long (required; 0s means all)")
	cmd.Flags().StringVar(&reason, "reason", "", "why the events are purged (recorded in the audit table)")
	cmd.Flags().StringVar(&actor, "actor", defaultActor(), "who purges (recorded in the audit table)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "show what would be deleted; change nothing")
	cmd.Flags().StringVar(&confirm, "confirm", "", "the token a --dry-run printed: purge exactly the events it showed, or nothing")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	cmd.RunE = c.run(func(cmd *cobra.Command, _ []string, svc *admin.Service) error {
		if !cmd.Flags().Changed("older-than") {
			return errors.New("--older-than is required (for example --older-than 720h; 0s purges every match)")
		}
		f, err := ff.filter(time.Now())
		if err != nil {
			return err
		}
		res, err := svc.Purge(cmd.Context(), src, admin.PurgeRequest{Filter: f, OlderThan: &olderThan, Actor: actor, Reason: reason, DryRun: dryRun, Confirm: confirm})
		if err != nil {
			return err
		}
		return writeResult(cmd.OutOrStdout(), res, asJSON, prefix(svc))
	})
	return cmd
}

func (c *cliEnv) auditCommand() *cobra.Command {
	var asJSON bool
	var eventID, source string
	var limit int
	cmd := &cobra.Command{Use: "audit", Short: "List the replay audit trail (requeues and purges), newest first", Args: cobra.NoArgs}
	cmd.Flags().StringVar(&eventID, "event-id", "", "only entries for this event id")
	cmd.Flags().StringVar(&source, "source", "", "only entries for this source (inbox or outbox)")
	cmd.Flags().IntVar(&limit, "limit", 100, "at most this many entries")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	cmd.RunE = c.run(func(cmd *cobra.Command, _ []string, svc *admin.Service) error {
		list, err := svc.Audit(cmd.Context(), eventID, admin.Source(source), limit)
		if err != nil {
			return err
		}
		if asJSON {
			return printJSON(cmd.OutOrStdout(), list)
		}
		tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tAT\tSOURCE\tACTION\tEVENT_ID\tACTOR\tREASON")
		for _, a := range list {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", a.ID, a.At.UTC().Format(time.RFC3339), a.Source,
				a.Action, a.EventID, a.Actor, oneLine(a.Reason, 60))
		}
		return tw.Flush()
	})
	return cmd
}

func (c *cliEnv) conflictsList() *cobra.Command {
	var handler, eventID string
	var limit int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List inbox key conflicts, newest first",
		Long: `List the deliveries whose dedup key was already stored for their handler with a
different payload (SHA-256 fingerprint): the same key, different content. The
stored event's effect stands; the conflicting delivery was not processed and is
kept here with its payload.`,
		Args: cobra.NoArgs,
	}
	cmd.Flags().StringVar(&handler, "handler", "", "only conflicts of this named handler")
	cmd.Flags().StringVar(&eventID, "event-id", "", "only conflicts involving this event id (stored or conflicting)")
	cmd.Flags().IntVar(&limit, "limit", 100, "at most this many conflicts")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	cmd.RunE = c.run(func(cmd *cobra.Command, _ []string, svc *admin.Service) error {
		if limit < 0 {
			return fmt.Errorf("--limit %d: must not be negative", limit)
		}
		list, err := svc.ListConflicts(cmd.Context(), handler, eventID, limit)
		if err != nil {
			return err
		}
		if asJSON {
			return printJSON(cmd.OutOrStdout(), list)
		}
		tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "DETECTED_AT\tHANDLER\tDEDUP_KEY\tSTORED_EVENT_ID\tEVENT_ID\tTYPE")
		for _, c := range list {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", c.DetectedAt.UTC().Format(time.RFC3339), c.Handler,
				oneLine(c.DedupKey, 60), c.StoredEventID, c.EventID, c.EventType)
		}
		return tw.Flush()
	})
	return cmd
}
