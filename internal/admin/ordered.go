package admin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/pgrelay/pgrelay/internal/inbox"
)

// Operations of ordered apply (inbox handlers run with --ordered): the keys
// whose events wait, skipping a gap, skipping a dead event that parks a key.

// OrderedStats summarises the keys of ordered handlers whose events wait.
type OrderedStats struct {
	// Gaps counts keys waiting for a sequence that never arrived; Reported
	// those of them waiting longer than the consumer's --gap-timeout.
	Gaps     int64 `json:"gaps"`
	Reported int64 `json:"gaps_reported"`
	// Parked counts keys waiting behind a dead event.
	Parked int64 `json:"parked"`
	// Behind counts keys whose next sequence is pending, retrying or in
	// flight while later ones wait.
	Behind int64 `json:"behind"`
	// Held counts the events waiting in all those keys.
	Held int64 `json:"held"`
}

// orderedStatsLimit bounds the keys Stats looks at.
const orderedStatsLimit = 10000

func (s *Service) orderedStats(ctx context.Context) (OrderedStats, error) {
	keys, err := inbox.ListWaiting(ctx, s.cfg.Pool, "", orderedStatsLimit)
	if err != nil {
		return OrderedStats{}, fmt.Errorf("admin: stats: %w", err)
	}
	var st OrderedStats
	for _, k := range keys {
		st.Held += k.Held
		switch k.State {
		case "gap":
			st.Gaps++
			if k.Reported != nil {
				st.Reported++
			}
		case "parked":
			st.Parked++
		default:
			st.Behind++
		}
	}
	return st, nil
}

func writeOrderedStats(tw io.Writer, st OrderedStats) {
	fmt.Fprintf(tw, "ordered keys waiting\tgap %d (reported %d), parked %d, behind %d; %d events held\n",
		st.Gaps, st.Reported, st.Parked, st.Behind, st.Held)
}

// Waiting lists up to limit keys of ordered handlers whose events wait (of
// handler, or of every handler when it is empty).
func (s *Service) Waiting(ctx context.Context, handler string, limit int) ([]inbox.WaitingKey, error) {
	if handler != "" {
		if err := inbox.ValidateHandlerName(handler); err != nil {
			return nil, fmt.Errorf("%w: handler: %v", ErrInvalid, err)
		}
	}
	if limit <= 0 || limit > s.cfg.MaxRows {
		limit = s.cfg.MaxRows
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	return inbox.ListWaiting(ctx, s.cfg.Pool, handler, limit)
}

// SkipRequest names what to skip and who asks.
type SkipRequest struct {
	Handler string `json:"handler"`
	// Key (SkipGap) or EventID (SkipDead).
	Key     string `json:"key,omitempty"`
	EventID string `json:"event_id,omitempty"`
	Actor   string `json:"actor"`
	Reason  string `json:"reason"`
}

func (r SkipRequest) check() error {
	if err := validateActor(r.Actor, r.Reason, true); err != nil {
		return err
	}
	if err := inbox.ValidateHandlerName(r.Handler); err != nil {
		return fmt.Errorf("%w: handler: %v", ErrInvalid, err)
	}
	return nil
}

// skipError maps the inbox's refusals onto ErrInvalid.
func skipError(err error) error {
	if errors.Is(err, inbox.ErrNoGap) || errors.Is(err, inbox.ErrNotParked) {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return err
}

// SkipGap gives up on the missing sequences of an ordered key (inbox.SkipGap):
// its held events run. Audited; the reason is required.
func (s *Service) SkipGap(ctx context.Context, r SkipRequest) (inbox.SkipResult, error) {
	if err := r.check(); err != nil {
		return inbox.SkipResult{}, err
	}
	if r.Key == "" {
		return inbox.SkipResult{}, fmt.Errorf("%w: key is required", ErrInvalid)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	res, err := inbox.SkipGap(ctx, s.cfg.Pool, inbox.Skip{Handler: r.Handler, Actor: r.Actor, Reason: r.Reason}, r.Key)
	if err != nil {
		return res, skipError(err)
	}
	s.cfg.Logger.Info("ordered gap skipped", zap.String("handler", r.Handler), zap.String("key", r.Key),
		zap.Int64("from_seq", res.From), zap.Int64("to_seq", res.To), zap.String("actor", r.Actor))
	return res, nil
}

// SkipDead gives up on a dead event that parks its ordered key
// (inbox.SkipDead): the key's later events run; the event stays dead.
// Audited; the reason is required.
func (s *Service) SkipDead(ctx context.Context, r SkipRequest) (inbox.SkipResult, error) {
	if err := r.check(); err != nil {
		return inbox.SkipResult{}, err
	}
	if r.EventID == "" {
		return inbox.SkipResult{}, fmt.Errorf("%w: event_id is required", ErrInvalid)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	res, err := inbox.SkipDead(ctx, s.cfg.Pool, inbox.Skip{Handler: r.Handler, Actor: r.Actor, Reason: r.Reason}, r.EventID)
	if err != nil {
		return res, skipError(err)
	}
	s.cfg.Logger.Info("ordered dead event skipped", zap.String("handler", r.Handler), zap.String("event_id", r.EventID),
		zap.String("key", res.Key), zap.Int64("seq", res.From), zap.String("actor", r.Actor))
	return res, nil
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
	list.RunE = c.run(func(cmd *cobra.Command, _ []string, svc *Service) error {
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
	var req SkipRequest
	skip := &cobra.Command{
		Use:   "skip KEY",
		Short: "Give up on the missing sequences of an ordered key: its held events run",
		Long: `Give up on the missing sequences of an ordered key: the key's last applied
sequence moves to just below its first held event, which runs next. A skipped
event that arrives later is absorbed without running. Refused when the next
sequence is in the inbox (dead: use "dead skip"). Recorded in the audit table.`,
		Args: cobra.ExactArgs(1),
	}
	skip.Flags().StringVar(&req.Handler, "handler", inbox.DefaultHandlerName, "the ordered handler")
	skip.Flags().StringVar(&req.Actor, "actor", defaultActor(), "who skips (recorded in the audit table)")
	skip.Flags().StringVar(&req.Reason, "reason", "", "why (required; recorded in the audit table)")
	skip.RunE = c.run(func(cmd *cobra.Command, args []string, svc *Service) error {
		req.Key = args[0]
		res, err := svc.SkipGap(cmd.Context(), req)
		if err != nil {
			return err
		}
		fmt.Fprintf(cmd.OutOrStdout(), "key %s: skipped sequences %d-%d; %d waiting event(s) made due\n",
			res.Key, res.From, res.To, res.Woken)
		return nil
	})
	gaps.AddCommand(list, skip)
	return gaps
}

// deadSkipCommand is "dead skip".
func (c *cliEnv) deadSkipCommand() *cobra.Command {
	var req SkipRequest
	cmd := &cobra.Command{
		Use:   "skip EVENT_ID",
		Short: "Ordered handlers: give up on a dead event that parks its key; the key's later events run",
		Long: `Give up on a dead event of an ordered handler's key: the key moves past its
sequence and its later events run. The event stays dead (requeued later, it is
absorbed as a duplicate sequence). Refused for an event that is not the next
sequence of its key. Recorded in the audit table.`,
		Args: cobra.ExactArgs(1),
	}
	cmd.Flags().StringVar(&req.Handler, "handler", inbox.DefaultHandlerName, "the ordered handler")
	cmd.Flags().StringVar(&req.Actor, "actor", defaultActor(), "who skips (recorded in the audit table)")
	cmd.Flags().StringVar(&req.Reason, "reason", "", "why (required; recorded in the audit table)")
	cmd.RunE = c.run(func(cmd *cobra.Command, args []string, svc *Service) error {
		req.EventID = args[0]
		res, err := svc.SkipDead(cmd.Context(), req)
		if err != nil {
			return err
		}
		fmt.Fprintf(cmd.OutOrStdout(), "key %s: skipped dead sequence %d; %d waiting event(s) made due\n",
			res.Key, res.From, res.Woken)
		return nil
	})
	return cmd
}
