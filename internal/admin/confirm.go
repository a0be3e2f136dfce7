package admin

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// DefaultConfirmTTL is how long a dry run's confirmation stays valid unless
// Config.ConfirmTTL says otherwise.
const DefaultConfirmTTL = 10 * time.Minute

// ErrStale is returned when a confirmation no longer matches: it expired, or
// the events the request selects now are not exactly those its dry run
// showed. Nothing was done; review again.
var ErrStale = errors.New("admin: the confirmation is stale")

// A confirmation binds a run to exactly the events its dry run showed: a dry
// run that selects events returns one (Result.Confirm), and a requeue or
// purge given it (RequeueRequest.Confirm, PurgeRequest.Confirm) acts only when
// it selects the same events, for the same database (Config.Database),
// action, source, actor and reason, before it expires; otherwise it changes nothing and returns ErrStale. It is
// "v1.COUNT.EXPIRES.DIGEST": a digest of what was reviewed, not a credential.

// ConfirmTTL is how long a dry run's confirmation stays valid.
func (s *Service) ConfirmTTL() time.Duration { return s.cfg.ConfirmTTL }

// confirmToken returns the confirmation of picked, valid until expires.
func confirmToken(database, action string, src Source, actor, reason string, picked []DeadLetter, expires time.Time) string {
	return fmt.Sprintf("v1.%d.%d.%s", len(picked), expires.Unix(), confirmDigest(database, action, src, actor, reason, picked, expires.Unix()))
}

func confirmDigest(database, action string, src Source, actor, reason string, picked []DeadLetter, expires int64) string {
	keys := make([]string, 0, len(picked))
	for _, d := range picked {
		keys = append(keys, strings.Join([]string{d.Handler, d.DedupKey, strconv.FormatInt(d.ID, 10), d.EventID}, "\x00"))
	}
	slices.SortFunc(keys, cmp.Compare)
	h := sha256.New()
	for _, p := range append([]string{"pgrelay confirm v1", database, action, string(src), actor, reason, strconv.FormatInt(expires, 10)}, keys...) {
		fmt.Fprintf(h, "%d:%s;", len(p), p)
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// parsedConfirm is a confirmation token read back.
type parsedConfirm struct {
	token   string
	count   int
	expires int64
}

// parseConfirm reads token (empty: no confirmation) and refuses it when it
// is malformed or expired at now.
func parseConfirm(token string, now time.Time) (*parsedConfirm, error) {
	if token == "" {
		return nil, nil
	}
	parts := strings.Split(token, ".")
	if len(parts) != 4 || parts[0] != "v1" {
		return nil, fmt.Errorf("%w: confirm=%q is not a confirmation a dry run returned", ErrInvalid, token)
	}
	count, err1 := strconv.Atoi(parts[1])
	expires, err2 := strconv.ParseInt(parts[2], 10, 64)
	if err1 != nil || err2 != nil || count < 0 {
		return nil, fmt.Errorf("%w: confirm=%q is not a confirmation a dry run returned", ErrInvalid, token)
	}
	if now.Unix() >= expires {
		return nil, fmt.Errorf("%w: nothing was done: the confirmation expired at %s; review the request again (dry run)",
			ErrStale, time.Unix(expires, 0).UTC().Format(time.RFC3339))
	}
	return &parsedConfirm{token: token, count: count, expires: expires}, nil
}

// check refuses picked unless it is exactly what the confirmation reviewed.
func (c *parsedConfirm) check(database, action string, src Source, actor, reason string, picked []DeadLetter) error {
	if c == nil {
		return nil
	}
	want := fmt.Sprintf("v1.%d.%d.%s", c.count, c.expires, confirmDigest(database, action, src, actor, reason, picked, c.expires))
	if want != c.token {
		return fmt.Errorf("%w: nothing was done: the events it selects now (%d) are not the %d reviewed, or the action, actor or reason changed; review it again (dry run)",
			ErrStale, len(picked), c.count)
	}
	return nil
}
