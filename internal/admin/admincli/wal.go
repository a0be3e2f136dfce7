package admincli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgrelay/pgrelay/internal/admin"
)

// walCommand is "wal accept-gap".
func (c *cliEnv) walCommand() *cobra.Command {
	wal := &cobra.Command{
		Use:   "wal",
		Short: "WAL capture: accept the gap a failover or a dropped slot left",
	}
	var req admin.WALGapRequest
	accept := &cobra.Command{
		Use:   "accept-gap",
		Short: "Let the WAL capture stream its new slot past a gap",
		Long: `Let the WAL capture stream its new slot past the gap it refuses to skip: the
slot was missing where its history had one (a promotion before PostgreSQL 17,
or a dropped slot), so the events committed between its last confirmed position
and the new slot's start were read from no slot. Re-emit them first
(deploy/wal-rescan.sh, or from the producers' own records); docs/wal.md#failover.
Who accepted the gap, when and why is kept in pgrelay.wal_gaps.`,
		Args: cobra.NoArgs,
	}
	accept.Flags().StringVar(&req.Slot, "slot", "pgrelay", "the relays' --wal-slot")
	accept.Flags().StringVar(&req.Actor, "actor", defaultActor(), "who accepts (recorded)")
	accept.Flags().StringVar(&req.Reason, "reason", "", "why (required; recorded)")
	accept.RunE = c.run(func(cmd *cobra.Command, _ []string, svc *admin.Service) error {
		g, err := svc.AcceptWALGap(cmd.Context(), req)
		if err != nil {
			return err
		}
		fmt.Fprintf(cmd.OutOrStdout(), "%sslot %s: accepted the gap %s-%s (last confirmed position recorded at %s; %s)\n",
			prefix(svc), g.Slot, g.FromLSN, g.ToLSN, g.ConfirmedAt.UTC().Format(time.RFC3339), g.Cause)
		return nil
	})
	wal.AddCommand(accept)
	return wal
}
