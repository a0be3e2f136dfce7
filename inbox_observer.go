package pgrelay

import (
	"time"
)

// nopObserver ignores everything. It is the default InboxConfig.Observer.
type nopObserver struct{}

// Received does nothing.
func (nopObserver) Received(int, int) {}

// Claimed does nothing.
func (nopObserver) Claimed(int, int) {}

// Processed does nothing.
func (nopObserver) Processed(*InboxEvent, time.Duration) {}

// Retried does nothing.
func (nopObserver) Retried(*InboxEvent, string) {}

// Deferred does nothing.
func (nopObserver) Deferred(*InboxEvent) {}

// Dead does nothing.
func (nopObserver) Dead(*InboxEvent, string) {}

// Fenced does nothing.
func (nopObserver) Fenced(*InboxEvent) {}
