package nats

import (
	"github.com/nats-io/nats.go"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
)

// wireMessage is the NATS message of m in the publisher's wire format:
// toNATS's, with its headers turned into CloudEvents binary mode ("ce-"
// attributes, broker.CloudEventsHeaders) under broker.WireCloudEvents. The
// Nats-Msg-Id dedup id is the event id in both formats. Its error is
// permanent (an event CloudEvents cannot carry).
func (p *Publisher) wireMessage(m pgrelay.Message) (*nats.Msg, error) {
	nm := p.toNATS(m)
	if p.cfg.WireFormat != broker.WireCloudEvents {
		return nm, nil
	}
	h := make(map[string]string, len(nm.Header)+4)
	for k, vs := range nm.Header {
		if len(vs) > 0 {
			h[k] = vs[0]
		}
	}
	h, err := broker.CloudEventsHeaders(h, p.cfg.CloudEventsSource, broker.CloudEventsNATS)
	if err != nil {
		return nil, broker.Terminal(err)
	}
	nm.Header = make(nats.Header, len(h))
	for k, v := range h {
		nm.Header[k] = []string{v}
	}
	return nm, nil
}
