// Package logtest gives tests a *slog.Logger: one writing to the test's log,
// or one recording entries for assertions.
package logtest

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// New returns a logger writing every record to t.Log.
func New(t testing.TB) *slog.Logger { return NewAt(t, slog.LevelDebug) }

// NewAt returns a logger writing records of level min and above to t.Log.
func NewAt(t testing.TB, min slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(writer{t}, &slog.HandlerOptions{Level: min}))
}

type writer struct{ t testing.TB }

func (w writer) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// Entry is one recorded record.
type Entry struct {
	Level   slog.Level
	Message string
	Attrs   []slog.Attr
}

// ContextMap returns the entry's attributes by key: errors as their text,
// integers as int64, other values as slog resolves them.
func (e Entry) ContextMap() map[string]any {
	m := make(map[string]any, len(e.Attrs))
	for _, a := range e.Attrs {
		v := a.Value.Resolve()
		switch v.Kind() {
		case slog.KindInt64:
			m[a.Key] = v.Int64()
		case slog.KindString:
			m[a.Key] = v.String()
		default:
			x := v.Any()
			if err, ok := x.(error); ok {
				x = err.Error()
			} else if s, ok := x.(fmt.Stringer); ok {
				x = s.String()
			}
			m[a.Key] = x
		}
	}
	return m
}

// Logs are the entries a logger from Observe recorded.
type Logs struct {
	mu      sync.Mutex
	entries []Entry
}

// Observe returns a logger recording records of level min and above, and
// what it recorded.
func Observe(min slog.Level) (*slog.Logger, *Logs) {
	l := &Logs{}
	return slog.New(&recorder{logs: l, min: min}), l
}

// All returns the entries recorded so far.
func (l *Logs) All() []Entry {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Entry(nil), l.entries...)
}

// Len is the number of entries recorded.
func (l *Logs) Len() int { return len(l.All()) }

func (l *Logs) filter(keep func(Entry) bool) *Logs {
	out := &Logs{}
	for _, e := range l.All() {
		if keep(e) {
			out.entries = append(out.entries, e)
		}
	}
	return out
}

// FilterMessage returns the entries whose message is msg.
func (l *Logs) FilterMessage(msg string) *Logs {
	return l.filter(func(e Entry) bool { return e.Message == msg })
}

// FilterMessageSnippet returns the entries whose message contains s.
func (l *Logs) FilterMessageSnippet(s string) *Logs {
	return l.filter(func(e Entry) bool { return strings.Contains(e.Message, s) })
}

type recorder struct {
	logs  *Logs
	min   slog.Level
	attrs []slog.Attr
	group string
}

func (r *recorder) Enabled(_ context.Context, l slog.Level) bool { return l >= r.min }

func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	e := Entry{Level: rec.Level, Message: rec.Message, Attrs: append([]slog.Attr(nil), r.attrs...)}
	rec.Attrs(func(a slog.Attr) bool {
		a.Key = r.group + a.Key
		e.Attrs = append(e.Attrs, a)
		return true
	})
	r.logs.mu.Lock()
	r.logs.entries = append(r.logs.entries, e)
	r.logs.mu.Unlock()
	return nil
}

func (r *recorder) WithAttrs(as []slog.Attr) slog.Handler {
	c := *r
	c.attrs = append(append([]slog.Attr(nil), r.attrs...), as...)
	for i := len(r.attrs); i < len(c.attrs); i++ {
		c.attrs[i].Key = r.group + c.attrs[i].Key
	}
	return &c
}

func (r *recorder) WithGroup(name string) slog.Handler {
	c := *r
	c.group = r.group + name + "."
	return &c
}
