package logbridge

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

func TestZapWritesToSlog(t *testing.T) {
	var buf bytes.Buffer
	l := Zap(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})))
	l.Named("inbox").With(zap.String("handler", "billing")).Info("claimed", zap.Int("n", 3))
	l.Debug("hidden")
	out := buf.String()
	for _, want := range []string{"level=INFO", "msg=claimed", "logger=inbox", "handler=billing", "n=3"} {
		if !strings.Contains(out, want) {
			t.Errorf("log %q lacks %q", out, want)
		}
	}
	if strings.Contains(out, "hidden") {
		t.Errorf("a debug line passed an info handler: %q", out)
	}
	Zap(nil).Info("to nowhere") // no panic
}

func TestSlogWritesToZap(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	z := zap.New(core)
	l := Slog(z).With("handler", "billing")
	l.Info("claimed", "n", 3, "error", errors.New("boom"))
	l.Debug("hidden")
	all := logs.All()
	if len(all) != 1 {
		t.Fatalf("got %d entries, want 1: %v", len(all), all)
	}
	m := all[0].ContextMap()
	if all[0].Message != "claimed" || m["handler"] != "billing" || m["n"] != int64(3) || m["error"] != "boom" {
		t.Errorf("entry %q with %v", all[0].Message, m)
	}
	if Zap(Slog(z)).Core() != z.Core() {
		t.Error("a zap logger round-tripped through slog is not unwrapped")
	}
}
