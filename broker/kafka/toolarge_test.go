package kafka

import (
	"fmt"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgrelay/pgrelay/broker"
)

// TestTooLargeNamesTheLimit: a record the broker refuses as too large goes
// dead with a reason that names its size and the limit in force on the
// publisher's side (kafka.Config.MaxMessageBytes), as the check before
// sending does; the broker's own answer names no value.
func TestTooLargeNamesTheLimit(t *testing.T) {
	p := &Publisher{cfg: Config{MaxMessageBytes: 1024}}
	r := &kgo.Record{Topic: "orders", Key: []byte("k"), Value: make([]byte, 900)}
	n := recordSize(r)
	err := p.classify(r, fmt.Errorf("produce: %w", kerr.MessageTooLarge))
	if !broker.IsTerminal(err) {
		t.Fatalf("a record near the limit refused as too large is not terminal: %v", err)
	}
	for _, want := range []string{fmt.Sprintf("record of %d bytes", n), "kafka.Config.MaxMessageBytes is 1024", "max.message.bytes"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("reason %q does not say %q", err, want)
		}
	}
	small := &kgo.Record{Topic: "orders", Key: []byte("k"), Value: make([]byte, 10)}
	if err := p.classify(small, kerr.MessageTooLarge); broker.IsTerminal(err) {
		t.Errorf("a small record refused with its batch must stay transient: %v", err)
	}
}
