package rabbitmq

import (
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
)

// appID is the AMQP app-id property of every message pgrelay publishes.
const appID = "pgrelay"

// maxShortstr is the longest AMQP short string: routing keys, header names
// and most properties.
const maxShortstr = 255

// headerFrameOverhead is what a content header frame holds besides the
// properties: frame header and end (8), class, weight, body size and flags
// (14), with room to spare.
const headerFrameOverhead = 64

// Headers returns the AMQP headers table of m: pgrelay's logical headers
// (broker.EncodeHeaders: Pgrelay-Event-Id, -Topic, -Key, -Event-Type,
// -Occurred-At, -Content-Type, causation and correlation under their own
// names, the message's own headers as Pgrelay-H-<name>), all long strings.
func Headers(m pgrelay.Message) amqp.Table {
	h := broker.EncodeHeaders(m)
	t := make(amqp.Table, len(h))
	for k, v := range h {
		t[k] = v
	}
	return t
}

// encode turns m into an AMQP publishing and its routing key. Its errors are
// permanent: no retry changes the message. frameMax is the connection's
// negotiated frame size (0: unknown), maxBytes the largest body accepted.
func encode(m pgrelay.Message, frameMax, maxBytes int) (amqp.Publishing, string, error) {
	return encodeTable(m, Headers(m), frameMax, maxBytes)
}

// encodeTable is encode with the headers table h (Headers(m), or its
// CloudEvents form).
func encodeTable(m pgrelay.Message, h amqp.Table, frameMax, maxBytes int) (amqp.Publishing, string, error) {
	if len(m.Payload) > maxBytes {
		return amqp.Publishing{}, "", broker.Terminalf("message too large for RabbitMQ: payload of %d bytes, the limit is %d (Config.MaxMessageBytes or the server's max_message_size)", len(m.Payload), maxBytes)
	}
	if len(m.Topic) > maxShortstr {
		return amqp.Publishing{}, "", broker.Terminalf("topic of %d bytes is too long for an AMQP routing key (at most %d)", len(m.Topic), maxShortstr)
	}
	if len(m.EventID) > maxShortstr {
		return amqp.Publishing{}, "", broker.Terminalf("event id of %d bytes is too long for the AMQP message-id (at most %d)", len(m.EventID), maxShortstr)
	}
	size := headerFrameOverhead + len(m.EventID) + len(appID)
	for k, v := range h {
		if len(k) > maxShortstr {
			return amqp.Publishing{}, "", broker.Terminalf("header name %.40q... of %d bytes is too long for AMQP (at most %d)", k, len(k), maxShortstr)
		}
		size += 1 + len(k) + 1 + 4 + len(v.(string))
	}
	p := amqp.Publishing{
		Headers:      h,
		DeliveryMode: amqp.Persistent,
		MessageId:    m.EventID,
		AppId:        appID,
		Body:         m.Payload,
	}
	// The properties are short strings: set only when they fit (the
	// headers carry the full values either way).
	if len(m.ContentType) <= maxShortstr {
		p.ContentType = m.ContentType
		size += len(m.ContentType)
	}
	if len(m.EventType) <= maxShortstr {
		p.Type = m.EventType
		size += len(m.EventType)
	}
	if !m.OccurredAt.IsZero() {
		p.Timestamp = m.OccurredAt
	}
	if frameMax > 0 && size > frameMax {
		return amqp.Publishing{}, "", broker.Terminalf("message headers (key, event type and headers: about %d bytes) do not fit in one AMQP frame of %d bytes", size, frameMax)
	}
	if err := p.Headers.Validate(); err != nil {
		return amqp.Publishing{}, "", broker.Terminal(fmt.Errorf("headers: %w", err))
	}
	return p, m.Topic, nil
}
