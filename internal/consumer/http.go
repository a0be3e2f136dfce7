package consumer

import (
	"context"
	"encoding/json"
	"net/http"
	"time"
)

// HTTPHandler serves the consumer's health and counters:
//
//   - GET /healthz answers 200 when the consumer is attached to JetStream and
//     the database answers a ping within two seconds, else 503;
//   - GET /stats answers the counters (Stats) as JSON.
func (c *Consumer) HTTPHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		switch {
		case !c.Ready():
			http.Error(w, "not attached to JetStream", http.StatusServiceUnavailable)
		case c.cfg.Pool.Ping(ctx) != nil:
			http.Error(w, "database unreachable", http.StatusServiceUnavailable)
		default:
			_, _ = w.Write([]byte("ok\n"))
		}
	})
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(c.Stats())
	})
	return mux
}
