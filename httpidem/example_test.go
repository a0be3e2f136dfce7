package httpidem_test

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/httpidem"
)

// A payment endpoint: the charge row, its outbox event and the stored
// response commit in one transaction, so a retried request gets the first
// response and never charges twice.
func ExampleMiddleware_Handler() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		panic(err)
	}
	mw, err := httpidem.New(httpidem.Config{Pool: pool})
	if err != nil {
		panic(err)
	}
	pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := httpidem.Tx(r.Context())
		var id int64
		if err := tx.QueryRow(r.Context(), `INSERT INTO charges (order_id, amount) VALUES ($1, $2) RETURNING id`, "order-42", 1999).Scan(&id); err != nil {
			http.Error(w, "charge failed", http.StatusInternalServerError) // rolled back, key free
			return
		}
		if err := pgrelay.Enqueue(r.Context(), tx, pgrelay.Message{Topic: "payments", Key: "order-42", EventType: "PaymentCaptured"}); err != nil {
			http.Error(w, "enqueue failed", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(map[string]int64{"charge_id": id})
	})
	mux := http.NewServeMux()
	mux.Handle("/payments", mw.Handler(pay))
	go func() { // expired keys, in bounded batches
		for range time.Tick(time.Hour) {
			_, _ = mw.Clean(ctx)
		}
	}()
	_ = http.ListenAndServe("127.0.0.1:8080", mux)
}
