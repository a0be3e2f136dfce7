package handlers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/event"
)

// SQLSignature is the argument list a SQL handler function takes: event id,
// topic, key, event type, payload (raw bytes), headers (the event's own, plus
// Pgrelay-Content-Type and Pgrelay-Key-Seq when the event has them), attempt
// (1 on the first).
const SQLSignature = "(text, text, text, text, bytea, jsonb, integer)"

// SQLSTATE codes a SQL handler function raises to steer its event. Any code
// starting with SQLStatePermanent (PGRP0 … PGRPZ), and every data exception
// (class 22) or integrity constraint violation (class 23), sends the event to
// the dead letters with the error as its reason. A code starting with
// SQLStateDefer (PGRD1, ...) defers the event until the dependency named by
// the error's DETAIL (else its MESSAGE) is released. Every other error is
// transient: retried with backoff until the attempts run out.
const (
	SQLStatePermanent = "PGRP"
	SQLStateDefer     = "PGRD"
)

var functionName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*)?$`)

// SQL is an inbox handler that calls a database function with each event in
// the inbox transaction, so the function's writes commit with the event's
// processed mark, exactly once. The function returns void, or text[]: the
// dependencies it created, released for the events deferred on them.
type SQL struct {
	call     string // the SELECT statement, with the function's quoted name
	name     string
	releases bool
}

// NewSQL resolves function (name or schema.name, taking SQLSignature) in the
// database q reaches and returns a handler calling it. It fails when the name
// is malformed or no such function exists; the error says which signature it
// looked for.
func NewSQL(ctx context.Context, q db.DBTX, function string) (*SQL, error) {
	if !functionName.MatchString(function) {
		return nil, fmt.Errorf("%q is not a function name (name or schema.name)", function)
	}
	row, err := db.New().SQLHandlerFunction(ctx, q, function+SQLSignature)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("no function %s%s in the database", function, SQLSignature)
	}
	if err != nil {
		return nil, fmt.Errorf("looking up function %s%s: %w", function, SQLSignature, err)
	}
	h := &SQL{name: function}
	switch row.Returns {
	case "void":
	case "text[]":
		h.releases = true
	default:
		return nil, fmt.Errorf("function %s%s returns %s; it must return void or text[]", function, SQLSignature, row.Returns)
	}
	// The only statement built at run time: the function's name comes from
	// the catalog, quoted by quote_ident.
	h.call = "SELECT " + row.QualifiedName + "($1, $2, $3, $4, $5, $6, $7)"
	return h, nil
}

// Handle calls the function with ev in tx and maps its error by SQLSTATE.
func (h *SQL) Handle(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
	hj, err := json.Marshal(sqlHeaders(ev))
	if err != nil {
		return pgrelay.Permanent(fmt.Errorf("headers: %w", err))
	}
	args := []any{ev.EventID, ev.Topic, ev.Key, ev.EventType, ev.Payload, hj, int32(ev.Attempts)}
	if !h.releases {
		_, err = tx.Exec(ctx, h.call, args...)
		return h.mapError(err)
	}
	var released []*string
	if err := tx.QueryRow(ctx, h.call, args...).Scan(&released); err != nil {
		return h.mapError(err)
	}
	keys := make([]string, 0, len(released))
	for _, k := range released {
		if k != nil && *k != "" {
			keys = append(keys, *k)
		}
	}
	return pgrelay.Release(ctx, tx, keys...)
}

// sqlHeaders is the function's headers argument: the event's headers, with
// Pgrelay-Content-Type when the event has a content type and Pgrelay-Key-Seq
// (decimal) when it has a per-key sequence. ev is not modified.
func sqlHeaders(ev *pgrelay.InboxEvent) map[string]string {
	h := make(map[string]string, len(ev.Headers)+2)
	for k, v := range ev.Headers {
		h[k] = v
	}
	if ev.ContentType != "" {
		h[event.HeaderContentType] = ev.ContentType
	}
	if ev.KeySeq > 0 {
		h[event.HeaderKeySeq] = strconv.FormatInt(ev.KeySeq, 10)
	} else {
		delete(h, event.HeaderKeySeq) // only the event's own sequence goes by that name
	}
	return h
}

// mapError turns the function's error into the inbox's outcome.
func (h *SQL) mapError(err error) error {
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return fmt.Errorf("%s: %w", h.name, err)
	}
	code := pgErr.Code
	switch {
	case strings.HasPrefix(code, SQLStateDefer):
		dep := pgErr.Detail
		if dep == "" {
			dep = pgErr.Message
		}
		return pgrelay.Defer(dep)
	case strings.HasPrefix(code, SQLStatePermanent), strings.HasPrefix(code, "22"), strings.HasPrefix(code, "23"):
		return pgrelay.Permanent(fmt.Errorf("%s: SQLSTATE %s: %s", h.name, code, pgErr.Message))
	default:
		return fmt.Errorf("%s: SQLSTATE %s: %s", h.name, code, pgErr.Message)
	}
}
