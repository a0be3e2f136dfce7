package nats_test

import (
	"testing"

	"github.com/pgrelay/pgrelay/broker/brokertest"
)

// BenchmarkPublishBatch: brokertest.BenchmarkPublish against the local
// JetStream.
func BenchmarkPublishBatch(b *testing.B) {
	p, _ := newNATS(b)
	brokertest.BenchmarkPublish(b, p, "orders")
}
