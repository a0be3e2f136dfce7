package kafka

import (
	"testing"

	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/brokertest"
)

// TestCloudEventsConformance runs the broker conformance suite with the
// publishers in CloudEvents mode (the fault cases, which do not depend on
// the wire format, run in TestConformance).
func TestCloudEventsConformance(t *testing.T) {
	c := newCluster(t)
	c.wire = broker.WireCloudEvents
	brokertest.Run(t, c.harness(nil, 0))
}
