package admin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/pgrelay/pgrelay"
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
	keys, err := pgrelay.ListWaiting(ctx, s.cfg.Pool, "", orderedStatsLimit)
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

// Waiting lists up to limit keys of ordered handlers whose events wait (of
// handler, or of every handler when it is empty).
func (s *Service) Waiting(ctx context.Context, handler string, limit int) ([]pgrelay.WaitingKey, error) {
	if handler != "" {
		if err := pgrelay.ValidateHandlerName(handler); err != nil {
			return nil, fmt.Errorf("%w: handler: %v", ErrInvalid, err)
		}
	}
	if limit <= 0 || limit > s.cfg.MaxRows {
		limit = s.cfg.MaxRows
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	return pgrelay.ListWaiting(ctx, s.cfg.Pool, handler, limit)
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
	if err := pgrelay.ValidateHandlerName(r.Handler); err != nil {
		return fmt.Errorf("%w: handler: %v", ErrInvalid, err)
	}
	return nil
}

// skipError maps the inbox's refusals onto ErrInvalid.
func skipError(err error) error {
	if errors.Is(err, pgrelay.ErrNoGap) || errors.Is(err, pgrelay.ErrNotParked) {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return err
}

// SkipGap gives up on the missing sequences of an ordered key (pgrelay.SkipGap):
// its held events run. Audited; the reason is required.
func (s *Service) SkipGap(ctx context.Context, r SkipRequest) (pgrelay.SkipResult, error) {
	res, err := s.skip(ctx, r, "key", r.Key, func(ctx context.Context, sk pgrelay.Skip) (pgrelay.SkipResult, error) {
		return pgrelay.SkipGap(ctx, s.cfg.Pool, sk, r.Key)
	})
	if err == nil {
		s.cfg.Logger.Info("ordered gap skipped", slog.String("handler", r.Handler), slog.String("key", r.Key),
			slog.Int64("from_seq", res.From), slog.Int64("to_seq", res.To), slog.String("actor", r.Actor))
	}
	return res, err
}

// SkipDead gives up on a dead event that parks its ordered key
// (pgrelay.SkipDead): the key's later events run; the event stays dead.
// Audited; the reason is required.
func (s *Service) SkipDead(ctx context.Context, r SkipRequest) (pgrelay.SkipResult, error) {
	res, err := s.skip(ctx, r, "event_id", r.EventID, func(ctx context.Context, sk pgrelay.Skip) (pgrelay.SkipResult, error) {
		return pgrelay.SkipDead(ctx, s.cfg.Pool, sk, r.EventID)
	})
	if err == nil {
		s.cfg.Logger.Info("ordered dead event skipped", slog.String("handler", r.Handler), slog.String("event_id", r.EventID),
			slog.String("key", res.Key), slog.Int64("seq", res.From), slog.String("actor", r.Actor))
	}
	return res, err
}

// skip checks r and its target (field names it for the error), then runs
// the inbox's skip with the query timeout.
func (s *Service) skip(ctx context.Context, r SkipRequest, field, target string,
	run func(context.Context, pgrelay.Skip) (pgrelay.SkipResult, error)) (pgrelay.SkipResult, error) {
	if err := r.check(); err != nil {
		return pgrelay.SkipResult{}, err
	}
	if target == "" {
		return pgrelay.SkipResult{}, fmt.Errorf("%w: %s is required", ErrInvalid, field)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	res, err := run(ctx, pgrelay.Skip{Handler: r.Handler, Actor: r.Actor, Reason: r.Reason})
	if err != nil {
		return res, skipError(err)
	}
	return res, nil
}
