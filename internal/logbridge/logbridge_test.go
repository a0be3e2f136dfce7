package logbridge

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
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
