package broker_test

import (
	"strings"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/internal/event"
)

// TestExpiresAtHeader: an expiry travels as Pgrelay-Expires-At and Decode
// reads it back; an unreadable one stores the delivery dead instead of
// dropping the expiry.
func TestExpiresAtHeader(t *testing.T) {
	exp := time.Date(2030, 1, 2, 3, 4, 5, 678901000, time.UTC)
	m := pgrelay.Message{EventID: "e1", Topic: "orders", EventType: "T", ExpiresAt: exp}
	h := broker.EncodeHeaders(m)
	if h[event.HeaderExpiresAt] != "2030-01-02T03:04:05.678901Z" {
		t.Fatalf("header %q", h[event.HeaderExpiresAt])
	}
	if _, ok := broker.EncodeHeaders(pgrelay.Message{EventID: "e2", Topic: "orders"})[event.HeaderExpiresAt]; ok {
		t.Fatal("a message without expiry carries the header")
	}
	r := broker.Received{Headers: map[string][]string{}}
	for k, v := range h {
		r.Headers[k] = []string{v}
	}
	d, err := broker.Decode(r, broker.DecodeOptions{})
	if err != nil || d.DeadReason != "" {
		t.Fatalf("decode: %v %q", err, d.DeadReason)
	}
	if !d.Message.ExpiresAt.Equal(exp) {
		t.Fatalf("ExpiresAt %s, want %s", d.Message.ExpiresAt, exp)
	}
	if _, ok := d.Message.Headers[event.HeaderExpiresAt]; ok {
		t.Fatal("the expiry is also left among the message's own headers")
	}
	r.Headers[event.HeaderExpiresAt] = []string{"tomorrow"}
	d, err = broker.Decode(r, broker.DecodeOptions{})
	if err != nil || !strings.HasPrefix(d.DeadReason, broker.ReasonInvalidExpiresAt) {
		t.Fatalf("decode of a bad expiry: %v %q", err, d.DeadReason)
	}
}
