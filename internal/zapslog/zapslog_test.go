package zapslog

import (
	"errors"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

func TestWritesToZap(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	z := zap.New(core)
	l := New(z).With("handler", "billing")
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
