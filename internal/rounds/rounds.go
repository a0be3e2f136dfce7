// Package rounds drives a broker publisher's Publish on the caller's
// goroutine, in rounds, keeping the order broker.Publisher promises: the
// messages of one key are sent one after another, each once the previous
// one's outcome is known, and none of a key's later messages is sent after a
// transient failure.
//
// Each round starts every key's next message, then awaits their outcomes in
// the order they were started. Keys are in flight together, without a
// goroutine per key: a goroutine started per key and batch grew a fresh
// stack each time, which took about a tenth of the NATS publisher's CPU.
package rounds

import (
	"context"
	"fmt"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
)

// Await returns the outcome of a message that Send started.
type Await func() broker.Result

// Send starts publishing msgs[i] and returns what awaits its outcome. A
// failure to start it is its outcome: return an Await that reports it.
//
// mayBlock is false when the round already holds messages in flight: a
// publisher that bounds its messages in flight returns nil then, rather than
// wait for room that only this round's own outcomes would free; the message
// goes in the next round. With mayBlock true it must not return nil.
type Send func(i int, mayBlock bool) Await

// notSent is the outcome given to a key's messages after one of them failed
// transiently.
func notSent(key string, err error) error {
	return fmt.Errorf("not sent: an earlier event of key %q failed: %w", key, err)
}

// Err is the Await of a message that failed before it was sent.
func Err(err error) Await {
	return func() broker.Result { return broker.Result{Err: err} }
}

// Take takes a slot of slots, a publisher's bound on its messages in flight
// (release it once the message's outcome is known). With mayBlock false it
// takes none when none is free and returns false; otherwise it waits for
// one, or returns ctx's error.
func Take(ctx context.Context, slots chan struct{}, mayBlock bool) (bool, error) {
	select {
	case slots <- struct{}{}:
		return true, nil
	default:
	}
	if !mayBlock {
		return false, nil
	}
	select {
	case slots <- struct{}{}:
		return true, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// Publish publishes msgs with send and returns one result per message, in
// order.
func Publish(msgs []pgrelay.Message, send Send) []broker.Result {
	results := make([]broker.Result, len(msgs))
	// queues[k] holds the indexes of the k-th key's messages, in order.
	var queues [][]int
	slot := make(map[string]int, len(msgs))
	for i, m := range msgs {
		k, ok := slot[m.Key]
		if !ok {
			k = len(queues)
			slot[m.Key] = k
			queues = append(queues, nil)
		}
		queues[k] = append(queues[k], i)
	}
	type started struct {
		rest  []int // the key's messages after this one
		i     int
		await Await
	}
	round := make([]started, 0, len(queues))
	next := make([][]int, 0, len(queues))
	for len(queues) > 0 {
		round, next = round[:0], next[:0]
		for _, q := range queues {
			a := send(q[0], len(round) == 0)
			if a == nil {
				next = append(next, q) // no room: the next round
				continue
			}
			round = append(round, started{rest: q[1:], i: q[0], await: a})
		}
		for _, s := range round {
			results[s.i] = s.await()
			if err := results[s.i].Err; err != nil && !broker.IsTerminal(err) {
				for _, j := range s.rest {
					results[j].Err = notSent(msgs[s.i].Key, err)
				}
				continue
			}
			// Sent, or dead-lettered by the relay: the key goes on.
			if len(s.rest) > 0 {
				next = append(next, s.rest)
			}
		}
		queues, next = next, queues
	}
	return results
}
