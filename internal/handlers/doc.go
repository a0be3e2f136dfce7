// Package handlers holds the inbox handlers that cmd/consumer offers to teams
// that do not write Go: SQL calls a PL/pgSQL (or any) function of theirs inside
// the inbox transaction, HTTP posts each event to their webhook.
package handlers
