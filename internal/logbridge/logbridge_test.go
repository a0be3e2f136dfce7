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

func TestAtLeastFiltersLevels(t *testing.T) {
	var buf bytes.Buffer
	l := AtLeast(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), slog.LevelWarn)
	l.With("handler", "billing").Warn("slow", "n", 3)
	l.Info("hidden")
	out := buf.String()
	for _, want := range []string{"level=WARN", "msg=slow", "handler=billing", "n=3"} {
		if !strings.Contains(out, want) {
			t.Errorf("log %q lacks %q", out, want)
		}
	}
	if strings.Contains(out, "hidden") {
		t.Errorf("an info line passed a warn filter: %q", out)
	}
	Or(nil).Info("to nowhere") // no panic
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
}
