package relay

import (
	"context"
	"log/slog"
	"testing"
	"time"
)

// TestOutboxCleanerOffWhenRetentionNegative: a negative Retention turns the
// outbox upkeep off: Run returns at once without touching the database.
func TestOutboxCleanerOffWhenRetentionNegative(t *testing.T) {
	t.Parallel()
	c := newOutboxCleaner(Config{Retention: -1}.withDefaults(), slog.New(slog.DiscardHandler))
	done := make(chan struct{})
	go func() { defer close(done); c.Run(context.Background()) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run kept running with retention off")
	}
}
