// Package zapslog is the one place zap meets log/slog: the commands log with
// zap (their JSON and console formats) and hand everything else the
// *slog.Logger New returns.
package zapslog

import (
	"context"
	"log/slog"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// New returns a *slog.Logger writing to z (for a program that logs with zap
// and hands a logger to the public configurations).
func New(z *zap.Logger) *slog.Logger {
	if z == nil {
		z = zap.NewNop()
	}
	return slog.New(&handler{core: z.Core()})
}

// handler is a slog.Handler over a zapcore.Core.
type handler struct {
	core  zapcore.Core
	group string // the open group's prefix, "a.b."
}

func zapLevel(l slog.Level) zapcore.Level {
	switch {
	case l < slog.LevelInfo:
		return zapcore.DebugLevel
	case l < slog.LevelWarn:
		return zapcore.InfoLevel
	case l < slog.LevelError:
		return zapcore.WarnLevel
	default:
		return zapcore.ErrorLevel
	}
}

func (h *handler) Enabled(_ context.Context, l slog.Level) bool { return h.core.Enabled(zapLevel(l)) }

func (h *handler) field(a slog.Attr) zapcore.Field {
	v := a.Value.Resolve()
	if err, ok := v.Any().(error); ok && a.Key == "error" && h.group == "" {
		return zap.Error(err)
	}
	return zap.Any(h.group+a.Key, v.Any())
}

func (h *handler) Handle(_ context.Context, r slog.Record) error {
	ce := h.core.Check(zapcore.Entry{Level: zapLevel(r.Level), Time: r.Time, Message: r.Message}, nil)
	if ce == nil {
		return nil
	}
	fields := make([]zapcore.Field, 0, r.NumAttrs())
	r.Attrs(func(a slog.Attr) bool {
		fields = append(fields, h.field(a))
		return true
	})
	ce.Write(fields...)
	return nil
}

func (h *handler) WithAttrs(as []slog.Attr) slog.Handler {
	fields := make([]zapcore.Field, len(as))
	for i, a := range as {
		fields[i] = h.field(a)
	}
	return &handler{core: h.core.With(fields), group: h.group}
}

func (h *handler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return &handler{core: h.core, group: h.group + name + "."}
}
