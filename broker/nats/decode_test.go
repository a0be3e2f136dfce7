package nats

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/internal/event"
)

const testMaxPayload = 1024

// decode decodes a JetStream message the way the NATS subscriber does, with
// the subject prefix "pgrelay" and a 1 KiB payload limit.
func decode(t testing.TB, m natsMessage) broker.Delivery {
	t.Helper()
	d, err := decodeNATS(m, "pgrelay", testMaxPayload)
	require.NoError(t, err)
	return d
}

func goodDelivery() natsMessage {
	return natsMessage{
		Subject: "pgrelay.orders",
		Header: map[string][]string{
			MsgIDHeader:            {"evt-1"},
			event.HeaderEventID:    {"evt-1"},
			event.HeaderEventType:  {"OrderPaid"},
			event.HeaderTopic:      {"orders"},
			event.HeaderKey:        {"order-1"},
			event.HeaderOccurredAt: {"2026-01-02T03:04:05.123456789Z"},
			"Pgrelay-H-trace":      {"abc"},
		},
		Data:          []byte(`{"order_id":"order-1","amount_cents":100,"currency":"EUR"}`),
		Stream:        "PGRELAY",
		StreamSeq:     42,
		StreamCreated: time.Date(2026, 1, 1, 0, 0, 0, 5, time.UTC),
		Timestamp:     time.Date(2026, 1, 2, 3, 4, 6, 0, time.UTC),
	}
}

func TestDecodeGoodMessage(t *testing.T) {
	t.Parallel()
	d := goodDelivery()
	got := decode(t, d)
	require.Empty(t, got.DeadReason)
	require.Equal(t, pgrelay.Message{
		EventID:    "evt-1",
		Topic:      "orders",
		Key:        "order-1",
		EventType:  "OrderPaid",
		Payload:    d.Data,
		Headers:    map[string]string{"trace": "abc"},
		OccurredAt: time.Date(2026, 1, 2, 3, 4, 5, 123457000, time.UTC), // rounded to µs, as stored
	}, got.Message)
}

// TestDecodeOccurredAtEdges: the header is taken as written (rounded to the
// microsecond PostgreSQL keeps) up to both ends of the range; a value outside
// it is stored dead with the reason, never replaced by another time.
func TestDecodeOccurredAtEdges(t *testing.T) {
	t.Parallel()
	ok := map[string]time.Time{
		"0001-01-01T00:00:00.000001Z":      time.Date(1, 1, 1, 0, 0, 0, 1000, time.UTC),
		"9999-12-31T23:59:59.999999Z":      time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC),
		"9999-12-31T23:59:59.9999994Z":     time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC),
		"2026-06-01T12:00:00.000001+01:00": time.Date(2026, 6, 1, 11, 0, 0, 1000, time.UTC),
	}
	for h, want := range ok {
		d := goodDelivery()
		d.Header[event.HeaderOccurredAt] = []string{h}
		got := decode(t, d)
		require.Empty(t, got.DeadReason, h)
		require.Equal(t, want, got.Message.OccurredAt, h)
	}
	for _, h := range []string{"0001-01-01T00:00:00Z", "0001-01-01T00:00:00.0000004Z", "9999-12-31T23:59:59.9999995Z", "9999-12-31T23:59:59.999999999Z"} {
		d := goodDelivery()
		d.Header[event.HeaderOccurredAt] = []string{h}
		got := decode(t, d)
		require.True(t, strings.HasPrefix(got.DeadReason, broker.ReasonInvalidOccurredAt), "%s: reason %q", h, got.DeadReason)
		require.Contains(t, got.DeadReason, "out of range", h)
		requireStorable(t, got)
	}
}

func TestDecodeFallbacks(t *testing.T) {
	t.Parallel()
	d := goodDelivery()
	delete(d.Header, event.HeaderEventID)
	delete(d.Header, event.HeaderTopic)
	delete(d.Header, event.HeaderOccurredAt)
	got := decode(t, d)
	require.Empty(t, got.DeadReason)
	require.Equal(t, "evt-1", got.Message.EventID, "Nats-Msg-Id stands in for Pgrelay-Event-Id")
	require.Equal(t, "orders", got.Message.Topic, "topic from the subject without its prefix")
	require.Equal(t, d.Timestamp, got.Message.OccurredAt, "the stream timestamp stands in for occurred-at")
}

func TestDecodeMalformed(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		mutate func(d *natsMessage)
		reason string
		id     string // expected event id; empty means the fallback id
	}{
		{"missing event id", func(d *natsMessage) {
			delete(d.Header, event.HeaderEventID)
			delete(d.Header, MsgIDHeader)
		}, broker.ReasonMissingEventID, ""},
		{"empty event id", func(d *natsMessage) {
			d.Header[event.HeaderEventID] = []string{""}
			d.Header[MsgIDHeader] = []string{""}
		}, broker.ReasonMissingEventID, ""},
		{"event id too long", func(d *natsMessage) {
			d.Header[event.HeaderEventID] = []string{strings.Repeat("x", 300)}
		}, broker.ReasonInvalidEventID, ""},
		{"event id with control characters", func(d *natsMessage) {
			d.Header[event.HeaderEventID] = []string{"a\x00b"}
		}, broker.ReasonInvalidEventID, ""},
		{"event id not UTF-8", func(d *natsMessage) {
			d.Header[event.HeaderEventID] = []string{"a\xffb"}
		}, broker.ReasonInvalidEventID, ""},
		{"missing event type", func(d *natsMessage) {
			delete(d.Header, event.HeaderEventType)
		}, broker.ReasonMissingEventType, "evt-1"},
		{"event type not UTF-8", func(d *natsMessage) {
			d.Header[event.HeaderEventType] = []string{"Order\xc3Paid"}
		}, broker.ReasonInvalidHeader, "evt-1"},
		{"key with NUL", func(d *natsMessage) {
			d.Header[event.HeaderKey] = []string{"k\x00"}
		}, broker.ReasonInvalidHeader, "evt-1"},
		{"own header not UTF-8", func(d *natsMessage) {
			d.Header["Pgrelay-H-x"] = []string{"\xfe"}
		}, broker.ReasonInvalidHeader, "evt-1"},
		{"bad occurred-at", func(d *natsMessage) {
			d.Header[event.HeaderOccurredAt] = []string{"yesterday"}
		}, broker.ReasonInvalidOccurredAt, "evt-1"},
		{"oversized payload", func(d *natsMessage) {
			d.Data = bytes.Repeat([]byte("a"), 1025)
		}, broker.ReasonPayloadTooLarge, "evt-1"},
		{"payload declared JSON, not UTF-8", func(d *natsMessage) {
			d.Header[event.HeaderContentType] = []string{"application/json"}
			d.Data = []byte{'{', 0xff, 0xfe, '}'}
		}, broker.ReasonPayloadNotUTF8, "evt-1"},
		{"payload declared text, not UTF-8", func(d *natsMessage) {
			d.Header[event.HeaderContentType] = []string{"text/plain; charset=utf-8"}
			d.Data = []byte{0xff}
		}, broker.ReasonPayloadNotUTF8, "evt-1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := goodDelivery()
			tc.mutate(&d)
			got := decode(t, d)
			require.True(t, strings.HasPrefix(got.DeadReason, tc.reason), "reason %q", got.DeadReason)
			want := tc.id
			if want == "" {
				want = "nats:PGRELAY:1767225600000000005:42"
			}
			require.Equal(t, want, got.Message.EventID)
			require.Equal(t, d.Data, got.Message.Payload, "raw bytes kept")
			requireStorable(t, got)
		})
	}
}

func TestDecodeKeepsRawInvalidID(t *testing.T) {
	t.Parallel()
	d := goodDelivery()
	d.Header[event.HeaderEventID] = []string{"bad\x01id"}
	got := decode(t, d)
	require.Equal(t, `bad\x01id`, got.Message.Headers[broker.RawEventIDHeader])
}

// TestDecodeNoStreamSequence: a message without a usable id and without a
// stream position has no stable stand-in id; it is refused, never stored
// under a guess.
func TestDecodeNoStreamSequence(t *testing.T) {
	t.Parallel()
	d := goodDelivery()
	delete(d.Header, event.HeaderEventID)
	delete(d.Header, MsgIDHeader)
	d.StreamSeq = 0
	_, err := decodeNATS(d, "pgrelay", testMaxPayload)
	require.ErrorIs(t, err, broker.ErrNoStableID)
	d.Header[event.HeaderEventID] = []string{"evt-1"}
	got := decode(t, d)
	require.Equal(t, "evt-1", got.Message.EventID, "a message with its id needs no stream position")
	require.Equal(t, "subject pgrelay.orders", got.Ref)
}

// requireStorable checks what the inbox needs of every decoded message, dead
// or not: text PostgreSQL accepts, and a valid idempotency key.
func requireStorable(t *testing.T, got broker.Delivery) {
	t.Helper()
	require.NoError(t, event.ValidateEventID(got.Message.EventID))
	for _, s := range []string{got.Message.Topic, got.Message.Key, got.Message.EventType, got.DeadReason} {
		require.True(t, utf8.ValidString(s) && !strings.ContainsRune(s, 0), "unstorable text %q", s)
	}
	for k, v := range got.Message.Headers {
		require.True(t, utf8.ValidString(k) && !strings.ContainsRune(k, 0), "unstorable header name %q", k)
		require.True(t, utf8.ValidString(v) && !strings.ContainsRune(v, 0), "unstorable header value %q", v)
	}
	require.False(t, got.Message.OccurredAt.IsZero())
}

// FuzzDecode checks that Decode never panics, is deterministic, keeps the raw
// payload, always yields a storable message, and only accepts a message whose
// id came from its headers.
func FuzzDecode(f *testing.F) {
	g := goodDelivery()
	f.Add("pgrelay.orders", "evt-1", "evt-1", "OrderPaid", "orders", "order-1", "2026-01-02T03:04:05Z", "trace", "abc", g.Data, "PGRELAY", uint64(42))
	f.Add("pgrelay.orders", "", "", "OrderPaid", "", "", "", "", "", []byte(`{}`), "PGRELAY", uint64(1))
	f.Add("x", "a\x00b", "", "", "", "k\x00", "nope", "h\xff", "\x00", []byte{0xff, 0xfe}, "S", uint64(7))
	f.Add("pgrelay.", strings.Repeat("é", 200), "m", "T", "t\xc3", "", "2026-13-01T00:00:00Z", "", "", []byte(nil), "", uint64(0))
	f.Fuzz(func(t *testing.T, subject, eventID, msgID, eventType, topic, key, occurredAt, hname, hval string, data []byte, stream string, seq uint64) {
		h := map[string][]string{}
		set := func(k, v string) {
			if v != "" {
				h[k] = []string{v}
			}
		}
		set(event.HeaderEventID, eventID)
		set(MsgIDHeader, msgID)
		set(event.HeaderEventType, eventType)
		set(event.HeaderTopic, topic)
		set(event.HeaderKey, key)
		set(event.HeaderOccurredAt, occurredAt)
		set(event.HeaderPrefix+hname, hval)
		d := natsMessage{Subject: subject, Header: h, Data: data, Stream: stream, StreamSeq: seq, Timestamp: time.Unix(1, 0)}

		got, err := decodeNATS(d, "pgrelay", testMaxPayload)
		again, err2 := decodeNATS(d, "pgrelay", testMaxPayload)
		require.True(t, reflect.DeepEqual(got, again) && err == err2, "Decode is not deterministic")
		if err != nil {
			require.ErrorIs(t, err, broker.ErrNoStableID)
			require.True(t, stream == "" || seq == 0, "refused although the stream position is known")
			return
		}
		require.True(t, bytes.Equal(data, got.Message.Payload), "payload changed")
		requireStorable(t, got)
		if got.DeadReason == "" {
			want := eventID
			if want == "" {
				want = msgID
			}
			require.Equal(t, want, got.Message.EventID)
			require.NotEmpty(t, got.Message.EventType)
			require.LessOrEqual(t, len(data), testMaxPayload)
			if event.IsTextContentType(got.Message.ContentType) {
				require.True(t, utf8.Valid(data), "a payload declared text must be UTF-8")
			}
		} else if got.Message.EventID != eventID && got.Message.EventID != msgID {
			require.True(t, strings.HasPrefix(got.Message.EventID, "nats:"), "id %q is neither received nor a fallback", got.Message.EventID)
		}
	})
}

// TestDecodeCausation: the causation and correlation headers travel under
// their own names and land in Headers under the same names.
func TestDecodeCausation(t *testing.T) {
	t.Parallel()
	d := goodDelivery()
	d.Header[event.HeaderCausationID] = []string{"evt-0"}
	d.Header[event.HeaderCorrelationID] = []string{"flow-1"}
	got := decode(t, d)
	require.Empty(t, got.DeadReason)
	require.Equal(t, map[string]string{"trace": "abc", event.HeaderCausationID: "evt-0", event.HeaderCorrelationID: "flow-1"}, got.Message.Headers)
	require.Equal(t, "evt-0", got.Message.CausationID())
	require.Equal(t, "flow-1", got.Message.CorrelationID())
}

// TestDecodeBinaryPayload: a payload that is not UTF-8 is stored as received,
// not dead, unless its content type says text or JSON.
func TestDecodeBinaryPayload(t *testing.T) {
	t.Parallel()
	for _, ct := range []string{"", "application/x-protobuf", "application/octet-stream", "avro/binary"} {
		d := goodDelivery()
		d.Data = []byte{0x08, 0x96, 0x01, 0x00, 0xff}
		if ct != "" {
			d.Header[event.HeaderContentType] = []string{ct}
		}
		got := decode(t, d)
		require.Empty(t, got.DeadReason, "content type %q", ct)
		require.Equal(t, d.Data, got.Message.Payload)
		require.Equal(t, ct, got.Message.ContentType)
		require.NotContains(t, got.Message.Headers, event.HeaderContentType)
	}
}

// TestDecodeKeySeq: Pgrelay-Key-Seq comes back as pgrelay.Message.KeySeq, and
// broker.EncodeHeaders writes it only when set; a sequence the consumer cannot read
// stores the delivery dead with the reason.
func TestDecodeKeySeq(t *testing.T) {
	t.Parallel()
	d := goodDelivery()
	d.Header[event.HeaderKeySeq] = []string{"17"}
	got := decode(t, d)
	require.Empty(t, got.DeadReason)
	require.EqualValues(t, 17, got.Message.KeySeq)

	require.Equal(t, "17", broker.EncodeHeaders(pgrelay.Message{Key: "k", KeySeq: 17})[event.HeaderKeySeq])
	require.NotContains(t, broker.EncodeHeaders(pgrelay.Message{Key: "k"}), event.HeaderKeySeq)

	for _, bad := range []string{"", "0", "-3", "x1", "1.5", "99999999999999999999"} {
		d := goodDelivery()
		d.Header[event.HeaderKeySeq] = []string{bad}
		got := decode(t, d)
		require.True(t, strings.HasPrefix(got.DeadReason, broker.ReasonInvalidKeySeq), "%q: %q", bad, got.DeadReason)
		require.Zero(t, got.Message.KeySeq)
	}
	d = goodDelivery()
	delete(d.Header, event.HeaderKey)
	d.Header[event.HeaderKeySeq] = []string{"2"}
	require.Contains(t, decode(t, d).DeadReason, "without a "+event.HeaderKey)
}

// TestDecodeKeyTooLong: a key longer than event.MaxKeyLen (a producer
// publishing straight to the broker) stores the delivery dead with the reason,
// without the key and its sequence (no key index could hold them), the key's
// start kept in a header; a key at the limit passes.
func TestDecodeKeyTooLong(t *testing.T) {
	t.Parallel()
	d := goodDelivery()
	d.Header[event.HeaderKey] = []string{strings.Repeat("k", event.MaxKeyLen+1)}
	d.Header[event.HeaderKeySeq] = []string{"3"}
	got := decode(t, d)
	require.True(t, strings.HasPrefix(got.DeadReason, broker.ReasonKeyTooLong), got.DeadReason)
	require.Contains(t, got.DeadReason, "1025 bytes, the limit is 1024")
	require.NotContains(t, got.DeadReason, broker.ReasonInvalidKeySeq)
	require.Empty(t, got.Message.Key)
	require.Zero(t, got.Message.KeySeq)
	require.Equal(t, strings.Repeat("k", 256), got.Message.Headers[broker.RawKeyHeader])

	d = goodDelivery()
	d.Header[event.HeaderKey] = []string{strings.Repeat("k", event.MaxKeyLen)}
	d.Header[event.HeaderKeySeq] = []string{"3"}
	got = decode(t, d)
	require.Empty(t, got.DeadReason)
	require.Len(t, got.Message.Key, event.MaxKeyLen)
	require.EqualValues(t, 3, got.Message.KeySeq)
}
