package rabbitmq

import (
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
)

// wireEncode is encode in the publisher's wire format. Under
// broker.WireCloudEvents the headers table holds the CloudEvents binary-mode
// attributes (Config.CloudEventsPrefix, broker.CloudEventsHeaders) beside
// pgrelay's other headers, and datacontenttype is the content-type property,
// as the AMQP binding maps it; the message-id (the event id), type and
// timestamp properties are set as in pgrelay's format. The same headers are
// also encoded as an AMQP 1.0 application-properties section in
// AppPropertiesHeader, which RabbitMQ 3.x's AMQP 1.0 plugin hands to AMQP
// 1.0 consumers as their application-properties (it drops the 0-9-1
// headers). Its errors are permanent.
func (p *Publisher) wireEncode(m pgrelay.Message, frameMax, maxBytes int) (amqp.Publishing, string, error) {
	if p.cfg.WireFormat != broker.WireCloudEvents {
		return encode(m, frameMax, maxBytes)
	}
	if len(m.ContentType) > maxShortstr {
		return amqp.Publishing{}, "", broker.Terminalf("content type of %d bytes is too long for the AMQP content-type property (at most %d), which carries datacontenttype in CloudEvents mode", len(m.ContentType), maxShortstr)
	}
	logical := Headers(m)
	h := make(map[string]string, len(logical)+4)
	for k, v := range logical {
		if s, ok := v.(string); ok {
			h[k] = s
		}
	}
	b := broker.CloudEventsAMQP
	if p.cfg.CloudEventsPrefix != "" {
		b.Prefix = p.cfg.CloudEventsPrefix
	}
	h, err := broker.CloudEventsHeaders(h, p.cfg.CloudEventsSource, b)
	if err != nil {
		return amqp.Publishing{}, "", broker.Terminal(err)
	}
	t := make(amqp.Table, len(h)+1)
	for k, v := range h {
		t[k] = v
	}
	t[AppPropertiesHeader] = string(encodeAppProperties(h))
	return encodeTable(m, t, frameMax, maxBytes)
}
