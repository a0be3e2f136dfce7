// Package logbridge holds the two helpers every package that logs shares:
// Or (a configuration's unset Logger discards) and AtLeast (a level floor).
// The library, the engines and the adapters log with *slog.Logger only; the
// commands' zap logger reaches them through internal/zapslog.
package logbridge

import (
	"context"
	"log/slog"
)

// Or returns l, or a logger that discards everything when l is nil (a
// configuration's unset Logger).
func Or(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}

// AtLeast returns a logger writing l's records of level min and above only.
func AtLeast(l *slog.Logger, min slog.Level) *slog.Logger {
	return slog.New(minLevel{h: Or(l).Handler(), min: min})
}

type minLevel struct {
	h   slog.Handler
	min slog.Level
}

func (m minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= m.min && m.h.Enabled(ctx, l)
}
func (m minLevel) Handle(ctx context.Context, r slog.Record) error { return m.h.Handle(ctx, r) }
func (m minLevel) WithAttrs(as []slog.Attr) slog.Handler {
	return minLevel{h: m.h.WithAttrs(as), min: m.min}
}
func (m minLevel) WithGroup(name string) slog.Handler {
	return minLevel{h: m.h.WithGroup(name), min: m.min}
}
