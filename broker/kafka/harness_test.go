package kafka

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/brokertest"
	"github.com/pgrelay/pgrelay/internal/logtest"
)

// The tests run against kfake, franz-go's in-process Kafka speaking the real
// protocol, or, when KAFKA_BROKERS is set (host:port,...), against that
// cluster. Tests that inject faults through kfake's control hooks, cut
// connections through a proxy or restart the broker need kfake and skip on a
// real cluster.

// testPartitions is the partition count of every test topic.
const testPartitions = 3

// testMaxMessageBytes is the publishers' MaxMessageBytes in the tests.
const testMaxMessageBytes = 64 << 10

// cluster is where a test's topics live: a kfake cluster (fake set) or the
// cluster named by KAFKA_BROKERS.
type cluster struct {
	brokers []string
	fake    *kfake.Cluster
	// wire is the publishers' wire format (zero: pgrelay's).
	wire broker.WireFormat
}

// realBrokers returns KAFKA_BROKERS split, or nil.
func realBrokers() []string {
	v := strings.TrimSpace(os.Getenv("KAFKA_BROKERS"))
	if v == "" {
		return nil
	}
	return strings.Split(v, ",")
}

// newCluster returns the KAFKA_BROKERS cluster, or a fresh single-broker
// kfake cluster closed when the test ends.
func newCluster(t *testing.T, opts ...kfake.Opt) *cluster {
	t.Helper()
	if b := realBrokers(); b != nil {
		return &cluster{brokers: b}
	}
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)...)
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return &cluster{brokers: c.ListenAddrs(), fake: c}
}

// needFake skips the test on a real cluster.
func (c *cluster) needFake(t *testing.T, why string) {
	t.Helper()
	if c.fake == nil {
		t.Skipf("needs kfake (%s); KAFKA_BROKERS points at a real cluster", why)
	}
}

// createTopic creates topic with testPartitions partitions; an existing
// topic is fine.
func (c *cluster) createTopic(t *testing.T, topic string, partitions int32) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic = topic
	rt.NumPartitions = partitions
	rt.ReplicationFactor = -1
	req.Topics = append(req.Topics, rt)
	req.TimeoutMillis = 10000
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	for _, rt := range resp.Topics {
		if err := kerr.ErrorForCode(rt.ErrorCode); err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			t.Fatalf("create topic %s: %v", topic, err)
		}
	}
}

// config returns a publisher/subscriber config for namespace ns (its topic
// prefix) on c.
func (c *cluster) config(t *testing.T, ns string) Config {
	return Config{
		Brokers:         c.brokers,
		TopicPrefix:     ns,
		MaxMessageBytes: testMaxMessageBytes,
		SessionTimeout:  6 * time.Second,
		CommitInterval:  50 * time.Millisecond,
		MetadataMaxAge:  time.Second,
		DeliveryTimeout: 10 * time.Second,
		Logger:          logtest.New(t),
		WireFormat:      c.wire,
	}
}

func (c *cluster) publisher(t *testing.T, cfg Config) *Publisher {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	p, err := NewPublisher(ctx, cfg)
	if err != nil {
		t.Fatalf("publisher: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func (c *cluster) subscriber(t *testing.T, cfg Config) *Subscriber {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	s, err := NewSubscriber(ctx, cfg)
	if err != nil {
		t.Fatalf("subscriber: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// harness is the conformance suite's harness on c. dial, when set, routes
// every connection of the adapters it makes; producerRetries is the
// publishers' ProducerRetries.
func (c *cluster) harness(dial func(ctx context.Context, network, address string) (net.Conn, error), producerRetries int) brokertest.Harness {
	return brokertest.Harness{
		NewPublisher: func(t *testing.T, ns string) broker.Publisher {
			c.createTopic(t, ns+".orders", testPartitions)
			cfg := c.config(t, ns)
			cfg.Dial, cfg.ProducerRetries = dial, producerRetries
			p, err := NewPublisher(context.Background(), cfg)
			if err != nil {
				t.Fatalf("publisher: %v", err)
			}
			return p
		},
		NewSubscriber: func(t *testing.T, ns, consumer string) broker.Subscriber {
			c.createTopic(t, ns+".orders", testPartitions)
			cfg := c.config(t, ns)
			cfg.Dial = dial
			cfg.Group = ns + "." + consumer
			s, err := NewSubscriber(context.Background(), cfg)
			if err != nil {
				t.Fatalf("subscriber: %v", err)
			}
			return s
		},
		UnknownDestination: func(t *testing.T, ns string) broker.Publisher {
			cfg := c.config(t, ns) // no topic created
			cfg.Dial = dial
			p, err := NewPublisher(context.Background(), cfg)
			if err != nil {
				t.Fatalf("publisher: %v", err)
			}
			return p
		},
		MaxMessageBytes:   testMaxMessageBytes,
		ReportsDuplicates: false, // see Publisher: a new producer's copy is not recognised
		RedeliveryTimeout: 30 * time.Second,
	}
}

// TestConformance runs the broker conformance suite against the adapter.
// On kfake it also cuts connections through a toxiproxy proxy and restarts
// the broker (kfake.Ports + kfake.DataDir: same port, same storage).
func TestConformance(t *testing.T) {
	c := newCluster(t)
	h := c.harness(nil, 0)
	if c.fake != nil {
		h.Proxied = func(t *testing.T) (brokertest.Harness, *toxiproxy.Proxy) {
			px := brokertest.StartProxy(t, c.brokers[0])
			// kfake advertises its own address in metadata; send every
			// connection through the proxy instead. (The proxy rewrites
			// Listen when it starts again, to the same address: read it once.)
			addr := px.Listen
			dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, network, addr)
			}
			// The producer rides out a short cut by resending on its own
			// (in order, idempotently); without resends the cut fails the
			// records in flight, and the suite sees how they are reported.
			ph := c.harness(dial, -1)
			return ph, px
		}
		h.Restartable = func(t *testing.T) (brokertest.Harness, func(t *testing.T)) {
			rc := newRestartable(t)
			return rc.cluster.harness(nil, 0), rc.restart
		}
	}
	brokertest.Run(t, h)
}

// restartable is a kfake cluster that keeps its data on disk and can be
// closed and started again on the same port.
type restartable struct {
	cluster *cluster
	opts    []kfake.Opt
}

func newRestartable(t *testing.T) *restartable {
	t.Helper()
	dir := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	rc := &restartable{opts: []kfake.Opt{kfake.NumBrokers(1), kfake.Ports(port), kfake.DataDir(dir)}}
	fc, err := kfake.NewCluster(rc.opts...)
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	rc.cluster = &cluster{brokers: fc.ListenAddrs(), fake: fc}
	t.Cleanup(func() { rc.cluster.fake.Close() })
	return rc
}

// restart closes the cluster (persisting its state) and starts it again on
// the same port from the same directory.
func (rc *restartable) restart(t *testing.T) {
	t.Helper()
	rc.cluster.fake.Close()
	var fc *kfake.Cluster
	var err error
	for range 50 { // the port can take a moment to be free again
		if fc, err = kfake.NewCluster(rc.opts...); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("kfake restart: %v", err)
	}
	rc.cluster.fake = fc
}
