package rabbitmq_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/rabbitmq"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/testamqp"
)

func sample(id, topic, key string) pgrelay.Message {
	return pgrelay.Message{EventID: id, Topic: topic, Key: key, EventType: "OrderPaid", ContentType: "application/json",
		Payload: []byte(`{"amount":5}`), Headers: map[string]string{"Trace-Id": "t-1", event.HeaderCausationID: "cause"},
		OccurredAt: time.Date(2026, 11, 23, 1, 2, 3, 456789000, time.UTC)}
}

func newPublisher(t *testing.T, cfg rabbitmq.Config) *rabbitmq.Publisher {
	t.Helper()
	p, err := rabbitmq.NewPublisher(ctxT(t, 30*time.Second), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func newSubscriber(t *testing.T, cfg rabbitmq.Config) *rabbitmq.Subscriber {
	t.Helper()
	s, err := rabbitmq.NewSubscriber(ctxT(t, 30*time.Second), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func testConfig(t *testing.T) rabbitmq.Config {
	t.Helper()
	u := testamqp.URL(t)
	x, q := testamqp.Names(t, u)
	return rabbitmq.Config{URL: u, Exchange: x, Queue: q, ReconnectWait: 100 * time.Millisecond, ReconnectMaxWait: time.Second}
}

// rawGet fetches one message from queue with a plain AMQP client.
func rawGet(t *testing.T, u, queue string) amqp.Delivery {
	t.Helper()
	conn, err := amqp.Dial(u)
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	require.NoError(t, err)
	d, ok, err := ch.Get(queue, true)
	require.NoError(t, err)
	require.True(t, ok, "queue %s is empty", queue)
	return d
}

// TestPublishedMessageAsOnTheWire: what a plain AMQP client sees of a
// published event: persistent, message-id = event id, content-type and type
// properties, pgrelay's headers in the headers table, routing key = topic.
func TestPublishedMessageAsOnTheWire(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	p := newPublisher(t, cfg)
	m := sample("evt-wire-1", "orders", "order-1")
	res := p.Publish(ctxT(t, 30*time.Second), []pgrelay.Message{m})
	require.NoError(t, res[0].Err)
	require.False(t, res[0].Duplicate)

	d := rawGet(t, cfg.URL, cfg.Queue)
	require.Equal(t, amqp.Persistent, d.DeliveryMode)
	require.Equal(t, "evt-wire-1", d.MessageId)
	require.Equal(t, "application/json", d.ContentType)
	require.Equal(t, "OrderPaid", d.Type)
	require.Equal(t, "pgrelay", d.AppId)
	require.Equal(t, cfg.Exchange, d.Exchange)
	require.Equal(t, "orders", d.RoutingKey)
	require.Equal(t, m.Payload, d.Body)
	require.Equal(t, "evt-wire-1", d.Headers[event.HeaderEventID])
	require.Equal(t, "order-1", d.Headers[event.HeaderKey])
	require.Equal(t, "orders", d.Headers[event.HeaderTopic])
	require.Equal(t, "OrderPaid", d.Headers[event.HeaderEventType])
	require.Equal(t, "application/json", d.Headers[event.HeaderContentType])
	require.Equal(t, "2026-11-23T01:02:03.456789Z", d.Headers[event.HeaderOccurredAt])
	require.Equal(t, "t-1", d.Headers[event.HeaderPrefix+"Trace-Id"])
	require.Equal(t, "cause", d.Headers[event.HeaderCausationID])
}

// TestQueueDeclaredQuorum: the queue the adapter declares is a quorum queue
// on a server that has them (redeclaring it as classic is refused).
func TestQueueDeclaredQuorum(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	newPublisher(t, cfg)
	conn, err := amqp.Dial(cfg.URL)
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	if v, _ := conn.Properties["version"].(string); strings.HasPrefix(v, "3.7") || strings.HasPrefix(v, "3.6") {
		t.Skipf("RabbitMQ %s has no quorum queues", v)
	}
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(cfg.Queue, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum})
	require.NoError(t, err, "the queue is not a quorum queue")
	_, err = ch.QueueDeclare(cfg.Queue, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeClassic})
	var ae *amqp.Error
	require.True(t, errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed, "declaring it classic: %v", err)
}

// TestUnroutableIsPermanent: with the queue bound to one topic only, an
// event of another topic comes back (mandatory publishing, basic.return) and
// fails permanently, while the routable one, another key's, is confirmed.
func TestUnroutableIsPermanent(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.BindingKey = "orders"
	p := newPublisher(t, cfg)
	res := p.Publish(ctxT(t, 30*time.Second), []pgrelay.Message{
		sample("evt-unroutable", "nowhere", "k1"),
		sample("evt-routable", "orders", "k2"),
		sample("evt-unroutable-2", "nowhere", "k1"),
	})
	require.True(t, broker.IsTerminal(res[0].Err), "unroutable: %v", res[0].Err)
	require.Contains(t, res[0].Err.Error(), "unroutable")
	require.NoError(t, res[1].Err)
	require.True(t, broker.IsTerminal(res[2].Err), "unroutable: %v", res[2].Err)
	require.Equal(t, 1, testamqp.Count(t, cfg.URL, cfg.Queue))
	require.Equal(t, "evt-routable", rawGet(t, cfg.URL, cfg.Queue).MessageId)
}

// TestTooLargeIsPermanent: a payload over Config.MaxMessageBytes is refused
// without being sent; the other key's message goes through.
func TestTooLargeIsPermanent(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.MaxMessageBytes = 1000
	p := newPublisher(t, cfg)
	big := sample("evt-big", "orders", "k1")
	big.Payload = bytes.Repeat([]byte("x"), 1001)
	res := p.Publish(ctxT(t, 30*time.Second), []pgrelay.Message{big, sample("evt-small", "orders", "k2")})
	require.True(t, broker.IsTerminal(res[0].Err), "too large: %v", res[0].Err)
	require.NoError(t, res[1].Err)
	require.Equal(t, 1, testamqp.Count(t, cfg.URL, cfg.Queue))
}

// TestServerMaxMessageSizeIsPermanent: a message under Config.MaxMessageBytes
// but over the server's max_message_size closes the channel (406); the
// publisher classifies it permanent, adopts the server's limit (the next such
// message is refused before sending) and reconnects for the others. The
// server's limit is changed for the test (rabbitmqctl eval) and restored.
func TestServerMaxMessageSizeIsPermanent(t *testing.T) {
	u := testamqp.URL(t)
	if !restartable(u) {
		t.Skip("needs rabbitmqctl on the local server to change max_message_size")
	}
	rabbitctl := func(expr string) string {
		t.Helper()
		out, err := exec.Command("rabbitmqctl", "eval", expr).CombinedOutput()
		require.NoError(t, err, "%s", out)
		return strings.TrimSpace(string(out))
	}
	// "{ok,134217728}", or "undefined" when unset.
	was := rabbitctl("application:get_env(rabbit, max_message_size).")
	rabbitctl("application:set_env(rabbit, max_message_size, 200000).")
	t.Cleanup(func() {
		if n, ok := strings.CutPrefix(was, "{ok,"); ok {
			rabbitctl("application:set_env(rabbit, max_message_size, " + strings.TrimSuffix(n, "}") + ").")
		} else {
			rabbitctl("application:unset_env(rabbit, max_message_size).")
		}
	})
	cfg := testConfig(t)
	p := newPublisher(t, cfg) // its channel opens with the 200000 limit
	big := sample("evt-server-big", "orders", "k1")
	big.Payload = bytes.Repeat([]byte("x"), 300000)
	res := p.Publish(ctxT(t, 30*time.Second), []pgrelay.Message{big})
	require.True(t, broker.IsTerminal(res[0].Err), "over the server's limit: %v", res[0].Err)
	require.Contains(t, res[0].Err.Error(), "larger than configured max size")

	// The learned limit refuses the next one before sending it, so the
	// channel stays open: a small message right after goes through.
	big2 := big
	big2.EventID = "evt-server-big-2"
	big2.Payload = bytes.Repeat([]byte("y"), 250000)
	res = p.Publish(ctxT(t, 30*time.Second), []pgrelay.Message{big2})
	require.True(t, broker.IsTerminal(res[0].Err), "over the learned limit: %v", res[0].Err)
	require.Contains(t, res[0].Err.Error(), "the limit is 200000")
	res = p.Publish(ctxT(t, 30*time.Second), []pgrelay.Message{sample("evt-after-big", "orders", "k2")})
	require.NoError(t, res[0].Err)
	require.Equal(t, 1, testamqp.Count(t, cfg.URL, cfg.Queue))
}

// fetchN fetches until n deliveries arrived (or 20 s passed).
func fetchN(t *testing.T, s broker.Subscriber, n int) []broker.Delivery {
	t.Helper()
	var got []broker.Delivery
	end := time.Now().Add(20 * time.Second)
	for len(got) < n && time.Now().Before(end) {
		ds, err := s.Fetch(ctxT(t, 30*time.Second), n-len(got), 500*time.Millisecond)
		require.NoError(t, err)
		got = append(got, ds...)
	}
	require.Len(t, got, n)
	return got
}

// TestStandInIDStableAcrossRedelivery: a message without an event id (no
// Pgrelay-Event-Id header, no message-id) gets a stand-in id, with a dead
// reason; its redelivery (after the first subscriber closed without acking;
// the quorum queue then adds x-delivery-count) gets the same id, and another
// message gets another.
func TestStandInIDStableAcrossRedelivery(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	newPublisher(t, cfg) // declares the topology
	conn, err := amqp.Dial(cfg.URL)
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	require.NoError(t, err)
	for i := range 2 {
		require.NoError(t, ch.PublishWithContext(ctxT(t, 10*time.Second), cfg.Exchange, "orders", false, false, amqp.Publishing{
			Headers: amqp.Table{event.HeaderEventType: "OrderPaid", "Other": int32(7)}, Body: fmt.Appendf(nil, "anonymous %d", i),
			DeliveryMode: amqp.Persistent,
		}))
	}
	s1 := newSubscriber(t, cfg)
	first := fetchN(t, s1, 2)
	require.NoError(t, s1.Close())
	s2 := newSubscriber(t, cfg)
	again := fetchN(t, s2, 2)
	for i := range 2 {
		require.True(t, strings.HasPrefix(first[i].Message.EventID, "amqp:"+cfg.Queue+":"), first[i].Message.EventID)
		require.Contains(t, first[i].DeadReason, broker.ReasonMissingEventID)
		require.Equal(t, first[i].Message.EventID, again[i].Message.EventID, "stand-in id changed on redelivery")
		require.Contains(t, again[i].Ref, "redelivered")
		require.NoError(t, again[i].Ack(ctxT(t, 10*time.Second)))
	}
	require.NotEqual(t, first[0].Message.EventID, first[1].Message.EventID)
}

// TestPrefetchBoundsUnacked: with Config.Prefetch 3, no more than three
// deliveries are out unacknowledged; acknowledging them lets the next come.
func TestPrefetchBoundsUnacked(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.Prefetch = 3
	p := newPublisher(t, cfg)
	var msgs []pgrelay.Message
	for i := range 10 {
		msgs = append(msgs, sample(fmt.Sprintf("evt-prefetch-%d", i), "orders", "k"))
	}
	for _, r := range p.Publish(ctxT(t, 30*time.Second), msgs) {
		require.NoError(t, r.Err)
	}
	s := newSubscriber(t, cfg)
	got := fetchN(t, s, 3)
	more, err := s.Fetch(ctxT(t, 10*time.Second), 10, time.Second)
	require.NoError(t, err)
	require.Empty(t, more, "more than Prefetch deliveries unacknowledged")
	for _, d := range got {
		require.NoError(t, d.Ack(ctxT(t, 10*time.Second)))
		require.NoError(t, d.Ack(ctxT(t, 10*time.Second)), "a second ack is a no-op")
	}
	next := fetchN(t, s, 3)
	require.Equal(t, "evt-prefetch-3", next[0].Message.EventID)
}

// TestSkipDeclare: with Config.SkipDeclare, a missing exchange (publisher)
// or queue (subscriber) is an error at start naming the setting.
func TestSkipDeclare(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.SkipDeclare = true
	_, err := rabbitmq.NewPublisher(ctxT(t, 30*time.Second), cfg)
	require.ErrorContains(t, err, "Config.Exchange")
	_, err = rabbitmq.NewSubscriber(ctxT(t, 30*time.Second), cfg)
	require.ErrorContains(t, err, "Config.Queue")
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  rabbitmq.Config
		want string
	}{
		{rabbitmq.Config{}, "Config.URL is required"},
		{rabbitmq.Config{URL: "http://x"}, "Config.URL"},
		{rabbitmq.Config{URL: "amqp://h", Exchange: "amq.topic"}, "Config.Exchange"},
		{rabbitmq.Config{URL: "amqp://h", Queue: strings.Repeat("q", 256)}, "Config.Queue"},
		{rabbitmq.Config{URL: "amqp://h", QueueType: "stream"}, "Config.QueueType"},
		{rabbitmq.Config{URL: "amqp://h", Prefetch: -1}, "Config.Prefetch"},
		{rabbitmq.Config{URL: "amqp://h", Prefetch: 70000}, "Config.Prefetch"},
		{rabbitmq.Config{URL: "amqp://h", MaxInFlight: -2}, "Config.MaxInFlight"},
		{rabbitmq.Config{URL: "amqp://h", ConfirmTimeout: -time.Second}, "Config.ConfirmTimeout"},
		{rabbitmq.Config{URL: "amqp://h", ReconnectWait: time.Minute, ReconnectMaxWait: time.Second}, "Config.ReconnectMaxWait"},
	} {
		err := tc.cfg.WithDefaults().Validate()
		require.ErrorContains(t, err, tc.want)
	}
	require.NoError(t, rabbitmq.Config{URL: "amqps://u:p@h:5671/vh"}.WithDefaults().Validate())
	_, err := rabbitmq.NewPublisher(context.Background(), rabbitmq.Config{URL: "amqp://guest:secret@127.0.0.1:1/"})
	require.Error(t, err)
	require.NotContains(t, err.Error(), "secret")
}

// TestSubscriberSurvivesQueueDeletion: a queue deleted under an idle
// subscriber (RabbitMQ cancels its consumer) is declared again when the
// subscriber reconnects, and what is published to it afterwards arrives.
func TestSubscriberSurvivesQueueDeletion(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	s := newSubscriber(t, cfg)
	ds, err := s.Fetch(ctxT(t, 10*time.Second), 10, 200*time.Millisecond)
	require.NoError(t, err)
	require.Empty(t, ds)

	conn, err := amqp.Dial(cfg.URL)
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDelete(cfg.Queue, false, false, false)
	require.NoError(t, err)

	// The subscriber notices the cancelled consumer and declares the queue
	// again on its next fetches.
	require.Eventually(t, func() bool {
		_, err := s.Fetch(ctxT(t, 10*time.Second), 10, 100*time.Millisecond)
		if err != nil {
			return false
		}
		check, err := conn.Channel() // a failed passive declaration closes it
		if err != nil {
			return false
		}
		defer func() { _ = check.Close() }()
		_, err = check.QueueDeclarePassive(cfg.Queue, true, false, false, false, nil)
		return err == nil
	}, 20*time.Second, 50*time.Millisecond)
	p := newPublisher(t, cfg)
	res := p.Publish(ctxT(t, 30*time.Second), []pgrelay.Message{sample("evt-after-delete", "orders", "k")})
	require.NoError(t, res[0].Err)
	got := fetchN(t, s, 1)
	require.Equal(t, "evt-after-delete", got[0].Message.EventID)
}
