package adminhttp_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/admin"
	"github.com/pgrelay/pgrelay/internal/admin/adminhttp"
	"github.com/pgrelay/pgrelay/internal/admin/admintest"
)

// TestOrderedGapsAndSkipsOverHTTP: the API lists a parked key and a gap,
// refuses a skip without a reason or of the wrong kind, skips both (audited),
// and stats count them.
func TestOrderedGapsAndSkipsOverHTTP(t *testing.T) {
	t.Parallel()
	b := admintest.Setup(t)
	ctx := context.Background()
	msg := func(id, key string, seq int64) pgrelay.Incoming {
		return pgrelay.Incoming{Message: pgrelay.Message{EventID: id, Topic: "orders", Key: key, KeySeq: seq, EventType: "T", Payload: []byte(`{}`)}}
	}
	_, err := pgrelay.Receive(ctx, b.Pool, []pgrelay.Incoming{msg("p-1", "p", 1), msg("p-2", "p", 2), msg("g-2", "g", 2)})
	require.NoError(t, err)
	_, err = b.Pool.Exec(ctx, `UPDATE pgrelay.inbox SET status = 'dead', last_error = 'poison', finished_at = now() WHERE event_id = 'p-1'`)
	require.NoError(t, err)

	srv, err := adminhttp.NewServer(adminhttp.ServerConfig{Service: b.Svc})
	require.NoError(t, err)
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()

	code, body := admintest.Do(t, "GET", hs.URL+"/v1/inbox/gaps", "", nil)
	require.Equal(t, http.StatusOK, code, string(body))
	var keys []pgrelay.WaitingKey
	require.NoError(t, json.Unmarshal(body, &keys))
	states := map[string]string{}
	for _, k := range keys {
		states[k.Key] = k.State
	}
	require.Equal(t, map[string]string{"p": "parked", "g": "gap"}, states)
	st, err := b.Svc.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, admin.OrderedStats{Gaps: 1, Parked: 1, Held: 2}, st.Ordered)

	skipDead := admin.SkipRequest{Handler: "default", EventID: "p-1", Actor: "ops"}
	code, body = admintest.Do(t, "POST", hs.URL+"/v1/inbox/dead/skip", "", skipDead)
	require.Equal(t, http.StatusBadRequest, code, string(body))
	require.Contains(t, string(body), "reason")
	code, body = admintest.Do(t, "POST", hs.URL+"/v1/inbox/gaps/skip", "", admin.SkipRequest{Handler: "default", Key: "p", Actor: "ops", Reason: "x"})
	require.Equal(t, http.StatusBadRequest, code, string(body))
	require.Contains(t, string(body), "no gap")

	skipDead.Reason = "known bad payload"
	code, body = admintest.Do(t, "POST", hs.URL+"/v1/inbox/dead/skip", "", skipDead)
	require.Equal(t, http.StatusOK, code, string(body))
	var res pgrelay.SkipResult
	require.NoError(t, json.Unmarshal(body, &res))
	require.Equal(t, pgrelay.SkipResult{Key: "p", From: 1, To: 1, Woken: 0}, res)

	code, body = admintest.Do(t, "POST", hs.URL+"/v1/inbox/gaps/skip", "", admin.SkipRequest{Handler: "default", Key: "g", Actor: "ops", Reason: "lost upstream"})
	require.Equal(t, http.StatusOK, code, string(body))
	require.NoError(t, json.Unmarshal(body, &res))
	require.Equal(t, pgrelay.SkipResult{Key: "g", From: 1, To: 1, Woken: 0}, res)

	var n int
	require.NoError(t, b.Pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.replay_audit WHERE action IN ('skip_dead', 'skip_gap') AND actor = 'ops'`).Scan(&n))
	require.Equal(t, 2, n)
	code, body = admintest.Do(t, "GET", hs.URL+"/v1/inbox/gaps", "", nil)
	require.Equal(t, http.StatusOK, code)
	require.JSONEq(t, `[]`, string(body))
}
