// Package testamqp gives tests a RabbitMQ server: the one at AMQP_URL when
// set, otherwise the one on 127.0.0.1:5672 (guest/guest) when it answers.
// Without one the test is skipped, or fails when CI is set (a skip would let
// CI pass having run nothing). Tests that share the server isolate themselves
// with Names, which gives fresh exchange and queue names and deletes them
// when the test ends.
package testamqp

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/url"
	"os"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// DefaultURL is the server tried when AMQP_URL is unset.
const DefaultURL = "amqp://guest:guest@127.0.0.1:5672/"

// URL returns the URL of a RabbitMQ server for the test.
func URL(tb testing.TB) string {
	tb.Helper()
	u := os.Getenv("AMQP_URL")
	if u == "" {
		u = DefaultURL
	}
	pu, err := url.Parse(u)
	if err != nil {
		tb.Fatalf("testamqp: AMQP_URL %q: %v", u, err)
	}
	host := pu.Host
	if pu.Port() == "" {
		host = net.JoinHostPort(pu.Hostname(), "5672")
	}
	c, err := net.DialTimeout("tcp", host, 2*time.Second)
	if err != nil {
		msg := "testamqp: no RabbitMQ at " + host + " (" + err.Error() + "); set AMQP_URL or start rabbitmq-server"
		if os.Getenv("CI") != "" {
			tb.Fatal(msg)
		}
		tb.Skip(msg)
	}
	_ = c.Close()
	return u
}

// Names returns a fresh exchange name and queue name ("t-<random>") and
// deletes both, with whatever was bound, when the test ends.
func Names(tb testing.TB, url string) (exchange, queue string) {
	tb.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	base := "t-" + hex.EncodeToString(b)
	exchange, queue = base+"-x", base+"-q"
	tb.Cleanup(func() { Delete(tb, url, exchange, queue) })
	return exchange, queue
}

// Delete removes the exchange and the queue (missing ones are fine).
func Delete(tb testing.TB, url, exchange, queue string) {
	tb.Helper()
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		tb.Logf("testamqp: cleanup: %v", err)
		return
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		tb.Logf("testamqp: cleanup: %v", err)
		return
	}
	if _, err := ch.QueueDelete(queue, false, false, false); err != nil {
		tb.Logf("testamqp: cleanup: delete queue %s: %v", queue, err)
		if ch, err = conn.Channel(); err != nil {
			return
		}
	}
	if err := ch.ExchangeDelete(exchange, false, false); err != nil {
		tb.Logf("testamqp: cleanup: delete exchange %s: %v", exchange, err)
	}
}

// Count returns the number of ready messages in queue.
func Count(tb testing.TB, url, queue string) int {
	tb.Helper()
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		tb.Fatalf("testamqp: %v", err)
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		tb.Fatalf("testamqp: %v", err)
	}
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		tb.Fatalf("testamqp: inspect queue %s: %v", queue, err)
	}
	return q.Messages
}

// Retry calls f until it succeeds or d has passed, pausing between attempts,
// and returns its last error. Tests that share the server use it around
// connecting and publishing: another test may be restarting the server
// (the conformance suite's restart sub-test) for a few seconds.
func Retry(d time.Duration, f func() error) error {
	end := time.Now().Add(d)
	for {
		err := f()
		if err == nil || time.Now().After(end) {
			return err
		}
		time.Sleep(250 * time.Millisecond)
	}
}
