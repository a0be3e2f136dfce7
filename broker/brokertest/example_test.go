package brokertest_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/brokertest"
)

// Example_adapter is how a third-party adapter proves itself: a test of its
// own package runs the suite with a Harness over its real broker, each test
// in a namespace of its own (a stream, a topic prefix, an exchange).
func Example_adapter() {
	var newPublisher func(t *testing.T, ns string) broker.Publisher             // the adapter's
	var newSubscriber func(t *testing.T, ns, consumer string) broker.Subscriber // the adapter's
	conformance := func(t *testing.T) {
		brokertest.Run(t, brokertest.Harness{NewPublisher: newPublisher, NewSubscriber: newSubscriber})
	}
	_ = conformance // func TestConformance(t *testing.T) { ... } in the adapter's package

	ns := brokertest.Namespace("orders")
	fmt.Println(strings.HasPrefix(ns, "orders_"), strings.Trim(ns, "abcdefghijklmnopqrstuvwxyz0123456789_") == "")
	// Output:
	// true true
}
