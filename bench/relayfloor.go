package main

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgrelay/pgrelay/internal/event"
)

// producerConns is the number of connections of the producer figures.
const producerConns = 8

// relayFloors measures the two halves of the relay's work, each done with the
// least code, on fresh resources: read & mark (the floor outbox drain), and
// the broker floor: the same messages (subject, headers, payload, Nats-Msg-Id)
// published to JetStream asynchronously with at most window awaiting their
// acknowledgement.
func (b *bench) relayFloors(ctx context.Context, n, window int) (mark, pub time.Duration, err error) {
	pool, _, err := b.dbs.fresh(ctx, b.cfg.Workers+1)
	if err != nil {
		return 0, 0, err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, floorSchema); err != nil {
		return 0, 0, fmt.Errorf("floor schema: %w", err)
	}
	gen := newGenerator("relayfloor")
	err = b.parallelBatches(ctx, n, b.cfg.BatchSize, func(ctx context.Context, from, to int) error {
		evs := gen.batch(from, to)
		_, err := pool.Exec(ctx, floorOutboxInsertBatch, evs.ids, topic, evs.keys, eventType, evs.payloads)
		return err
	})
	if err != nil {
		return 0, 0, fmt.Errorf("floor outbox insert: %w", err)
	}
	if mark, err = b.floorOutboxDrain(ctx, pool, n); err != nil {
		return 0, 0, err
	}
	pub, err = b.brokerFloor(ctx, n, window)
	return mark, pub, err
}

// brokerFloor publishes n events to a fresh stream on a connection of its
// own, asynchronously, at most window in flight, and returns the time until
// the last acknowledgement.
func (b *bench) brokerFloor(ctx context.Context, n, window int) (time.Duration, error) {
	streamName, prefix, err := b.nats.stream(ctx)
	if err != nil {
		return 0, err
	}
	defer b.nats.dropStream(streamName)
	nc, err := nats.Connect(b.nats.url, nats.Timeout(5*time.Second))
	if err != nil {
		return 0, fmt.Errorf("broker floor: connect: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(window), jetstream.WithPublishAsyncTimeout(10*time.Second))
	if err != nil {
		return 0, err
	}
	gen := newGenerator("brokerfloor")
	subject := prefix + "." + topic
	msgs := make([]*nats.Msg, n)
	for i := range msgs {
		e := gen.event(i)
		h := nats.Header{}
		h[event.HeaderEventID] = []string{e.id}
		h[event.HeaderTopic] = []string{topic}
		h[event.HeaderKey] = []string{e.key}
		h[event.HeaderEventType] = []string{eventType}
		h[event.HeaderOccurredAt] = []string{time.Now().UTC().Format(time.RFC3339Nano)}
		msgs[i] = &nats.Msg{Subject: subject, Header: h, Data: e.payload}
	}
	var failed atomic.Int64
	d, err := timed(func() error {
		futures := make([]jetstream.PubAckFuture, n)
		for i, m := range msgs {
			f, err := js.PublishMsgAsync(m, jetstream.WithMsgID(m.Header.Get(event.HeaderEventID)), jetstream.WithStallWait(30*time.Second))
			if err != nil {
				return fmt.Errorf("broker floor: publish: %w", err)
			}
			futures[i] = f
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-ctx.Done():
			return ctx.Err()
		}
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				if err != nil {
					failed.Add(1)
				}
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if k := failed.Load(); k > 0 {
		return 0, fmt.Errorf("broker floor: %d of %d publishes failed", k, n)
	}
	return d, nil
}

// runProducerGroup measures the producers' commit path: producerConns
// connections each committing one event per transaction, through the real
// outbox (its triggers included) and, alternately, into the floor's plain
// table. No relay runs.
func (b *bench) runProducerGroup(ctx context.Context) {
	n := b.cfg.Events
	for range b.cfg.Repeats {
		b.attempt(ctx, "producer commit path", []string{"floor_producer_one", "producer_one"}, func(ctx context.Context) error {
			pool, _, err := b.dbs.fresh(ctx, producerConns+1)
			if err != nil {
				return err
			}
			defer pool.Close()
			if _, err := pool.Exec(ctx, floorSchema); err != nil {
				return fmt.Errorf("floor schema: %w", err)
			}
			// The three inserts take turns in slices of the run, so that a
			// change in the machine's load falls on all of them alike; the
			// figures are each variant's events over its summed time.
			insert := func(gen generator, lo, hi int, sql string) (time.Duration, error) {
				next := atomic.Int64{}
				next.Store(int64(lo))
				return timed(func() error {
					return fanOut(ctx, producerConns, func(ctx context.Context, _ int) error {
						for {
							i := int(next.Add(1)) - 1
							if i >= hi {
								return nil
							}
							e := gen.event(i)
							if _, err := pool.Exec(ctx, sql, e.id, topic, e.key, eventType, e.payload); err != nil {
								return fmt.Errorf("%s: %w", gen.prefix, err)
							}
						}
					})
				})
			}
			variants := []struct {
				gen generator
				sql string
				d   time.Duration
			}{
				{newGenerator("plain"), floorOutboxInsertOne, 0},
				{newGenerator("outbox"), producerOutboxInsertOne, 0},
				{newGenerator("outbox-noseq"), producerOutboxInsertOneNoSeq, 0},
			}
			for r := range producerSlices {
				lo, hi := r*n/producerSlices, (r+1)*n/producerSlices
				for i := range variants {
					d, err := insert(variants[i].gen, lo, hi, variants[i].sql)
					if err != nil {
						return err
					}
					variants[i].d += d
				}
			}
			plain, real, noSeq := variants[0].d, variants[1].d, variants[2].d
			b.sample("floor_producer_one", rate(n, plain))
			b.sample("producer_one", rate(n, real))
			b.sample("producer_one_noseq", rate(n, noSeq))
			b.sample("producer_one_seq", rate(n, real))
			return nil
		})
	}
	b.note("producer_one", strconv.Itoa(producerConns)+" connections, "+strconv.Itoa(n)+" transactions of one INSERT INTO pgrelay.outbox each (the plain-SQL contract, triggers included, per-key sequences assigned); no relay running")
	b.note("producer_one_seq", "its ratio is the rate with per-key sequences over the rate without (key = event id): below 1 is the sequences' cost")
}

// producerSlices is the number of turns the producer figures' variants take.
const producerSlices = 10

// producerOutboxInsertOne is a producer's plain-SQL insert into the outbox.
const producerOutboxInsertOne = `INSERT INTO pgrelay.outbox (event_id, topic, key, event_type, payload) VALUES ($1, $2, $3, $4, $5)`

// producerOutboxInsertOneNoSeq is the same insert with the event keyed by its
// own id ($3 unused): the trigger still takes a key lock but assigns no
// per-key sequence, so producer_one / producer_one_noseq is the cost of the
// sequence (its counter upsert and event id check).
const producerOutboxInsertOneNoSeq = `INSERT INTO pgrelay.outbox (event_id, topic, key, event_type, payload) VALUES ($1, $2, $1 || left($3, 0), $4, $5)`
