package adminhttp

import (
	"net/http"

	"github.com/pgrelay/pgrelay/internal/admin"
)

// handleGaps lists the keys of ordered handlers whose events wait: GET
// /v1/inbox/gaps with optional handler and limit parameters.
func (s *Server) handleGaps(w http.ResponseWriter, r *http.Request) {
	n, err := queryInt(r, "limit")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	keys, err := service(r).Waiting(r.Context(), r.URL.Query().Get("handler"), n)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, keys)
}

// handleGapSkip skips a gap: POST /v1/inbox/gaps/skip with a SkipRequest
// (handler, key, actor, reason).
func (s *Server) handleGapSkip(w http.ResponseWriter, r *http.Request) {
	var body admin.SkipRequest
	if err := decodeBody(r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	res, err := service(r).SkipGap(r.Context(), body)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// handleDeadSkip skips a dead event parking an ordered key: POST
// /v1/inbox/dead/skip with a SkipRequest (handler, event_id, actor, reason).
func (s *Server) handleDeadSkip(w http.ResponseWriter, r *http.Request) {
	var body admin.SkipRequest
	if err := decodeBody(r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	res, err := service(r).SkipDead(r.Context(), body)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}
