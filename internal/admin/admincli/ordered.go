package admincli

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/admin"
)

// The subcommands of ordered apply (inbox handlers run with --ordered).

func writeOrderedStats(tw io.Writer, st admin.OrderedStats) {
	fmt.Fprintf(tw, "ordered keys waiting\tgap %d (reported %d), parked %d, behind %d; %d events held\n",
		st.Gaps, st.Reported, st.Parked, st.Behind, st.Held)
}

// gapsCommand is "gaps list" and "gaps skip".
func (c *cliEnv) gapsCommand() *cobra.Command {
	gaps := &cobra.Command{
		Use:   "gaps",
		Short: "Ordered handlers: list the keys whose events wait, skip a gap",
	}
	var handler string
	var limit int
	var asJSON bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List the keys of ordered handlers whose events wait, and why",
		Long: `List the keys of ordered handlers (--ordered) whose later events wait for an
earlier sequence: STATE gap (it never arrived; REPORTED once it waited longer
than --gap-timeout), parked (it is dead: requeue it with "dead requeue" or skip
it with "dead skip") or behind (it is pending, retrying or in flight).`,
		Args: cobra.NoArgs,
	}
	list.Flags().StringVar(&handler, "handler", "", "only keys of this named handler")
	list.Flags().IntVar(&limit, "limit", 100, "at most this many keys")
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	list.RunE = c.run(func(cmd *cobra.Command, _ []string, svc *admin.Service) error {
		keys, err := svc.Waiting(cmd.Context(), handler, limit)
		if err != nil {
			return err
		}
		if asJSON {
			return printJSON(cmd.OutOrStdout(), keys)
		}
		tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "HANDLER\tKEY\tSTATE\tLAST_APPLIED\tWAITING_FOR\tHELD\tSINCE\tREPORTED")
		for _, k := range keys {
			since, reported := k.Oldest.UTC().Format(time.RFC3339), ""
			if k.GapSince != nil {
				since = k.GapSince.UTC().Format(time.RFC3339)
			}
			if k.Reported != nil {
				reported = k.Reported.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", k.Handler, oneLine(k.Key, 60), k.State, k.LastApplied,
				k.WaitingFor, k.Held, since, reported)
		}
		return tw.Flush()
	})
	var req admin.SkipRequest
	skip := &cobra.Command{
		Use:   "skip KEY",
		Short: "Give up on the missing sequences of an ordered key: its held events run",
		Long: `Give up on the missing sequences of an ordered key: the key's last applied
sequence moves to just below its first held event, which runs next. A skipped
event that arrives later is absorbed without running. Refused when the next
sequence is in the inbox (dead: use "dead skip"). Recorded in the audit table.`,
		Args: cobra.ExactArgs(1),
	}
	skip.Flags().StringVar(&req.Handler, "handler", pgrelay.DefaultHandlerName, "the ordered handler")
	skip.Flags().StringVar(&req.Actor, "actor", defaultActor(), "who skips (recorded in the audit table)")
	skip.Flags().StringVar(&req.Reason, "reason", "", "why (required; recorded in the audit table)")
	skip.RunE = c.run(func(cmd *cobra.Command, args []string, svc *admin.Service) error {
		req.Key = args[0]
		res, err := svc.SkipGap(cmd.Context(), req)
		if err != nil {
			return err
		}
		fmt.Fprintf(cmd.OutOrStdout(), "%skey %s: skipped sequences %d-%d; %d waiting event(s) made due\n",
			prefix(svc), res.Key, res.From, res.To, res.Woken)
		return nil
	})
	gaps.AddCommand(list, skip)
	return gaps
}

// deadSkipCommand is "dead skip".
func (c *cliEnv) deadSkipCommand() *cobra.Command {
	var req admin.SkipRequest
	cmd := &cobra.Command{
		Use:   "skip EVENT_ID",
		Short: "Ordered handlers: give up on a dead event that parks its key; the key's later events run",
		Long: `Give up on a dead event of an ordered handler's key: the key moves past its
sequence and its later events run. The event stays dead (requeued later, it is
absorbed as a duplicate sequence). Refused for an event that is not the next
sequence of its key. Recorded in the audit table.`,
		Args: cobra.ExactArgs(1),
	}
	cmd.Flags().StringVar(&req.Handler, "handler", pgrelay.DefaultHandlerName, "the ordered handler")
	cmd.Flags().StringVar(&req.Actor, "actor", defaultActor(), "who skips (recorded in the audit table)")
	cmd.Flags().StringVar(&req.Reason, "reason", "", "why (required; recorded in the audit table)")
	cmd.RunE = c.run(func(cmd *cobra.Command, args []string, svc *admin.Service) error {
		req.EventID = args[0]
		res, err := svc.SkipDead(cmd.Context(), req)
		if err != nil {
			return err
		}
		fmt.Fprintf(cmd.OutOrStdout(), "%skey %s: skipped dead sequence %d; %d waiting event(s) made due\n",
			prefix(svc), res.Key, res.From, res.Woken)
		return nil
	})
	return cmd
}
