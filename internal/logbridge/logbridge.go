// Package logbridge lets the engine, which logs with zap, log to the
// *slog.Logger a library user gives the public configs.
package logbridge

import (
	"context"
	"log/slog"
	"sort"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Zap returns a zap logger writing to l's handler, or a no-op logger when l
// is nil.
func Zap(l *slog.Logger) *zap.Logger {
	if l == nil {
		return zap.NewNop()
	}
	if h, ok := l.Handler().(*handler); ok { // a zap logger given as slog: unwrap
		return zap.New(h.core)
	}
	return zap.New(&core{h: l.Handler()})
}

// core is a zapcore.Core over a slog.Handler.
type core struct {
	h    slog.Handler
	name string
}

func level(l zapcore.Level) slog.Level {
	switch {
	case l <= zapcore.DebugLevel:
		return slog.LevelDebug
	case l == zapcore.InfoLevel:
		return slog.LevelInfo
	case l == zapcore.WarnLevel:
		return slog.LevelWarn
	default:
		return slog.LevelError
	}
}

func attrs(fields []zapcore.Field) []slog.Attr {
	if len(fields) == 0 {
		return nil
	}
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range fields {
		f.AddTo(enc)
	}
	keys := make([]string, 0, len(enc.Fields))
	for k := range enc.Fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]slog.Attr, 0, len(keys))
	for _, k := range keys {
		out = append(out, slog.Any(k, enc.Fields[k]))
	}
	return out
}

func (c *core) Enabled(l zapcore.Level) bool { return c.h.Enabled(context.Background(), level(l)) }

func (c *core) With(fields []zapcore.Field) zapcore.Core {
	return &core{h: c.h.WithAttrs(attrs(fields)), name: c.name}
}

func (c *core) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *core) Write(e zapcore.Entry, fields []zapcore.Field) error {
	r := slog.NewRecord(e.Time, level(e.Level), e.Message, 0)
	if e.LoggerName != "" {
		r.AddAttrs(slog.String("logger", e.LoggerName))
	}
	r.AddAttrs(attrs(fields)...)
	return c.h.Handle(context.Background(), r)
}

func (c *core) Sync() error { return nil }

// Slog returns a *slog.Logger writing to z (for a program that logs with zap
// and hands a logger to the public configurations).
func Slog(z *zap.Logger) *slog.Logger {
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
