package broker

import (
	"fmt"
	"net/url"
	"strings"
	"unicode"

	"github.com/pgrelay/pgrelay/internal/event"
)

// WireFormat is how an adapter's publisher lays an event out on its broker.
// A subscriber reads both formats whatever the setting: Decode recognises a
// CloudEvent by its specversion attribute.
type WireFormat string

const (
	// WirePgrelay is pgrelay's own layout: the event's metadata in
	// Pgrelay-* headers (EncodeHeaders), the payload as the body. The
	// default (the zero value means it too).
	WirePgrelay WireFormat = "pgrelay"
	// WireCloudEvents is the CloudEvents 1.0 binary content mode of the
	// broker's protocol binding: the payload is the data, the CloudEvents
	// attributes are headers with the binding's prefix (NATS "ce-", Kafka
	// "ce_", AMQP "cloudEvents_"), and pgrelay's remaining headers (topic,
	// key sequence, causation, correlation, the message's own headers) travel
	// beside them as in WirePgrelay. See CloudEventsHeaders.
	WireCloudEvents WireFormat = "cloudevents"
)

// DefaultCloudEventsSource is the CloudEvents source attribute of the
// events a publisher sends in WireCloudEvents when none is configured.
const DefaultCloudEventsSource = "pgrelay"

// CloudEventsSpecVersion is the only CloudEvents version written and
// accepted.
const CloudEventsSpecVersion = "1.0"

// ReasonInvalidCloudEvent starts the dead reason of a delivery that says it
// is a CloudEvent (it has a specversion attribute) but breaks the
// specification: another specversion, no source. A missing id or type has
// the reasons every format has (ReasonMissingEventID, ReasonMissingEventType).
const ReasonInvalidCloudEvent = "invalid CloudEvent"

// CheckWireFormat checks a wire format setting: "" (WirePgrelay),
// WirePgrelay or WireCloudEvents.
func CheckWireFormat(f WireFormat) error {
	switch f {
	case "", WirePgrelay, WireCloudEvents:
		return nil
	}
	return fmt.Errorf("%q is not a wire format: want %s or %s", string(f), WirePgrelay, WireCloudEvents)
}

// CheckCloudEventsSource checks a CloudEvents source: a non-empty
// URI-reference of printable ASCII without spaces, at most 255 bytes (an AMQP
// short string).
func CheckCloudEventsSource(s string) error {
	if s == "" {
		return fmt.Errorf("must not be empty")
	}
	if len(s) > 255 {
		return fmt.Errorf("%q... is %d bytes, the limit is 255", s[:32], len(s))
	}
	for _, r := range s {
		if r > unicode.MaxASCII || !unicode.IsPrint(r) || r == ' ' {
			return fmt.Errorf("%q is not a URI-reference: only printable ASCII without spaces", s)
		}
	}
	if _, err := url.Parse(s); err != nil {
		return fmt.Errorf("%q is not a URI-reference: %w", s, err)
	}
	return nil
}

// CloudEventsBinding is how one protocol binding of CloudEvents names the
// attributes in binary content mode.
type CloudEventsBinding struct {
	// Prefix prefixes every attribute's header name.
	Prefix string
	// ContentType is the header that carries datacontenttype, when the
	// binding gives it one of its own ("content-type" for Kafka); empty
	// means Prefix+"datacontenttype". For AMQP, the adapter carries it in the
	// content-type property instead and OmitContentType is set.
	ContentType string
	// OmitContentType leaves datacontenttype out of the headers: the
	// adapter carries it in a property of its own (AMQP content-type).
	OmitContentType bool
}

// The CloudEvents protocol bindings of the adapters.
var (
	// CloudEventsNATS: "ce-" headers, datacontenttype as
	// ce-datacontenttype (NATS protocol binding, binary mode).
	CloudEventsNATS = CloudEventsBinding{Prefix: "ce-"}
	// CloudEventsKafka: "ce_" headers, datacontenttype as the content-type
	// header (Kafka protocol binding, binary mode). The record key is the
	// event key, which is also the partitionkey attribute.
	CloudEventsKafka = CloudEventsBinding{Prefix: "ce_", ContentType: "content-type"}
	// CloudEventsAMQP: "cloudEvents_" headers (application properties),
	// datacontenttype as the AMQP content-type property (AMQP protocol
	// binding, binary mode; "_" is the separator JMS clients can read).
	CloudEventsAMQP = CloudEventsBinding{Prefix: "cloudEvents_", OmitContentType: true}
)

// The CloudEvents attribute names pgrelay maps.
const (
	ceSpecVersion     = "specversion"
	ceID              = "id"
	ceSource          = "source"
	ceType            = "type"
	ceTime            = "time"
	ceSubject         = "subject"
	ceDataContentType = "datacontenttype"
	cePartitionKey    = "partitionkey"
)

// CloudEventsHeaderPrefix prefixes, in the inbox, the CloudEvents
// attributes a received CloudEvent carries that have no pgrelay field of
// their own: "ce-source" (except from a pgrelay relay), "ce-subject" (when
// it is not the key), "ce-dataschema" and every extension but partitionkey
// ("ce-traceparent").
const CloudEventsHeaderPrefix = "ce-"

// CloudEventsHeaders turns pgrelay's logical headers h (EncodeHeaders'
// result, as an adapter is about to map it onto its broker) into the
// binary-mode headers of binding b, in place, and returns h:
//
//   - specversion "1.0", source = source;
//   - id = the event id (Pgrelay-Event-Id), type = the event type, time =
//     occurred-at (RFC 3339, UTC);
//   - subject and partitionkey = the key (both left out for an empty key);
//   - datacontenttype = the content type (see CloudEventsBinding);
//   - every other header (Pgrelay-Topic, Pgrelay-Key-Seq, causation,
//     correlation, Pgrelay-H-<name>, trace context) unchanged: CloudEvents
//     SDKs ignore headers without the binding's prefix, and a pgrelay
//     subscriber reads them as in WirePgrelay, so per-key order and causation
//     work the same in both formats.
//
// It fails only for an event CloudEvents cannot carry: one without an event
// type (the type attribute is required).
func CloudEventsHeaders(h map[string]string, source string, b CloudEventsBinding) (map[string]string, error) {
	if h[event.HeaderEventType] == "" {
		return nil, fmt.Errorf("the event has no event type, and a CloudEvent needs one (type attribute)")
	}
	if source == "" {
		source = DefaultCloudEventsSource
	}
	move := func(from, attr string) {
		if v, ok := h[from]; ok {
			delete(h, from)
			if v != "" {
				h[b.Prefix+attr] = v
			}
		}
	}
	h[b.Prefix+ceSpecVersion] = CloudEventsSpecVersion
	h[b.Prefix+ceSource] = source
	move(event.HeaderEventID, ceID)
	move(event.HeaderEventType, ceType)
	move(event.HeaderOccurredAt, ceTime)
	if key := h[event.HeaderKey]; key != "" {
		h[b.Prefix+ceSubject] = key
		h[b.Prefix+cePartitionKey] = key
	}
	delete(h, event.HeaderKey)
	if ct, ok := h[event.HeaderContentType]; ok {
		delete(h, event.HeaderContentType)
		switch {
		case b.OmitContentType || ct == "":
		case b.ContentType != "":
			h[b.ContentType] = ct
		default:
			h[b.Prefix+ceDataContentType] = ct
		}
	}
	return h, nil
}

// cePrefixes are the lower-cased prefixes under which a specversion header
// marks a delivery as a CloudEvent in binary mode: NATS and HTTP, Kafka,
// AMQP (both separators).
var cePrefixes = []string{"ce-", "ce_", "cloudevents_", "cloudevents:"}

// cloudEvent is a received CloudEvent's attributes, read from a binary-mode
// delivery's headers.
type cloudEvent struct {
	// prefix is the binding's prefix as received ("ce-", "cloudEvents_").
	prefix string
	// attrs holds the attributes by lower-case name (extensions included),
	// the first value of each.
	attrs map[string]string
	// contentType is the binding's own content-type header, when present.
	contentType string
	hasCT       bool
}

// detectCloudEvent returns the CloudEvent a delivery's headers carry in
// binary mode, or nil when they carry none (no specversion header under a
// known prefix). Header names are matched without regard to case.
func detectCloudEvent(headers map[string][]string) *cloudEvent {
	var ce *cloudEvent
	for name, vs := range headers {
		lower := strings.ToLower(name)
		for _, p := range cePrefixes {
			if lower == p+ceSpecVersion && len(vs) > 0 {
				if ce == nil || name[:len(p)] < ce.prefix { // deterministic when several
					ce = &cloudEvent{prefix: name[:len(p)]}
				}
			}
		}
	}
	if ce == nil {
		return nil
	}
	lp := strings.ToLower(ce.prefix)
	ce.attrs = make(map[string]string)
	for name, vs := range headers {
		if len(vs) == 0 {
			continue
		}
		lower := strings.ToLower(name)
		if strings.HasPrefix(lower, lp) {
			ce.attrs[lower[len(lp):]] = vs[0]
		} else if lower == "content-type" {
			ce.contentType, ce.hasCT = vs[0], true
		}
	}
	return ce
}

// attrName is how a dead reason names attribute a of ce: as it was sent.
func (ce *cloudEvent) attrName(a string) string { return ce.prefix + a }

// fromCloudEvent rewrites d.r.Headers, a binary-mode CloudEvent, into
// pgrelay's logical headers for the remaining Decode steps: id, type, time,
// partitionkey and datacontenttype become the event id, event type,
// occurred-at, key and content type; source (unless a pgrelay relay sent
// it: then the message decodes exactly as in pgrelay's format), dataschema, a
// subject other than the key and every other extension are kept as the
// message's own headers under CloudEventsHeaderPrefix. Headers without the prefix
// (Pgrelay-Topic, Pgrelay-Key-Seq, Pgrelay-H-*, ...) are read as usual. A
// specversion other than 1.0 or a missing source adds a reason; the broker's
// message id never stands in for a missing id attribute (a CloudEvent without
// one is invalid).
func (d *decoder) fromCloudEvent(ce *cloudEvent) {
	d.ce = ce
	h := make(map[string][]string, len(d.r.Headers))
	lp := strings.ToLower(ce.prefix)
	for name, vs := range d.r.Headers {
		switch strings.ToLower(name) {
		case strings.ToLower(event.HeaderEventID), strings.ToLower(event.HeaderEventType),
			strings.ToLower(event.HeaderOccurredAt), strings.ToLower(event.HeaderKey), "content-type":
			continue // only the attributes say these
		}
		if strings.HasPrefix(strings.ToLower(name), lp) {
			continue
		}
		h[name] = vs
	}
	set := func(name, v string) { h[name] = []string{v} }
	// A pgrelay relay always writes Pgrelay-Topic beside the attributes. Its
	// source is its own setting, not part of the event: such a CloudEvent is
	// stored exactly as the same event in pgrelay's format.
	_, fromRelay := h[event.HeaderTopic]
	if v := ce.attrs[ceSpecVersion]; v != CloudEventsSpecVersion {
		d.fail("%s: %s %q, want %q", ReasonInvalidCloudEvent, ce.attrName(ceSpecVersion), Truncate(Printable(v), 64), CloudEventsSpecVersion)
	}
	if v, ok := ce.attrs[ceSource]; !ok || v == "" {
		d.fail("%s: no %s attribute", ReasonInvalidCloudEvent, ce.attrName(ceSource))
	}
	for a, v := range ce.attrs {
		switch a {
		case ceSpecVersion:
		case ceID:
			set(event.HeaderEventID, v)
		case ceType:
			set(event.HeaderEventType, v)
		case ceTime:
			set(event.HeaderOccurredAt, v)
		case cePartitionKey:
			set(event.HeaderKey, v)
		case ceDataContentType:
			set(event.HeaderContentType, v)
		case ceSubject:
			if v != ce.attrs[cePartitionKey] {
				set(event.HeaderPrefix+CloudEventsHeaderPrefix+a, v)
			}
		case ceSource:
			if !fromRelay {
				set(event.HeaderPrefix+CloudEventsHeaderPrefix+a, v)
			}
		default: // dataschema, extensions
			set(event.HeaderPrefix+CloudEventsHeaderPrefix+a, v)
		}
	}
	if _, ok := ce.attrs[ceDataContentType]; !ok && ce.hasCT {
		set(event.HeaderContentType, ce.contentType)
	}
	d.r.Headers = h
	d.r.BrokerID, d.r.BrokerIDName = "", ""
}

// CheckWire checks an adapter's wire settings: the format and, when set, the
// CloudEvents source. field names the setting at fault ("WireFormat" or
// "CloudEventsSource").
func CheckWire(f WireFormat, source string) (field string, err error) {
	if err := CheckWireFormat(f); err != nil {
		return "WireFormat", err
	}
	if source != "" {
		if err := CheckCloudEventsSource(source); err != nil {
			return "CloudEventsSource", err
		}
	}
	return "", nil
}
