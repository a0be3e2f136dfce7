package walmsg

import (
	"bytes"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRoundTrip(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 123456000, time.UTC)
	m := Event{EventID: "e1", Topic: "orders", Key: "k", EventType: "Created", ContentType: "application/json",
		Headers: map[string]string{"X-A": "1"}, OccurredAt: at, Payload: []byte(`{"a":1}`)}
	b, err := Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.EventID != "e1" || got.Topic != "orders" || got.Key != "k" || got.EventType != "Created" || got.ContentType != "application/json" ||
		got.Headers["X-A"] != "1" || !got.OccurredAt.Equal(at) || !bytes.Equal(got.Payload, m.Payload) {
		t.Fatalf("round trip: %+v", got)
	}
}

// TestDecodeSQLForm: what pgrelay.emit writes: base64 with PostgreSQL's line
// breaks, the content type among the headers, no key (the event id).
func TestDecodeSQLForm(t *testing.T) {
	payload := bytes.Repeat([]byte("x"), 100)
	b64 := base64.StdEncoding.EncodeToString(payload)
	b64 = b64[:76] + `\n` + b64[76:] // PostgreSQL's encode(..., 'base64') breaks lines at 76
	sql := `{"v":1,"id":"e2","topic":"t","at":"2026-01-02T03:04:05.000001Z","headers":{"Pgrelay-Content-Type":"text/plain"},` +
		`"payload":"` + b64 + `"}`
	got, err := Decode([]byte(sql))
	if err != nil {
		t.Fatal(err)
	}
	if got.Key != "e2" || got.ContentType != "text/plain" || len(got.Headers) != 0 || !bytes.Equal(got.Payload, payload) {
		t.Fatalf("decoded %+v", got)
	}
}

func TestDecodeRefuses(t *testing.T) {
	for name, in := range map[string]string{
		"version":  `{"v":2,"id":"e","topic":"t","payload":""}`,
		"no id":    `{"v":1,"topic":"t","payload":""}`,
		"no topic": `{"v":1,"id":"e","payload":""}`,
		"not json": `nope`,
	} {
		if _, err := Decode([]byte(in)); err == nil {
			t.Errorf("%s: decoded", name)
		} else if name == "version" && !errors.Is(err, ErrVersion) {
			t.Errorf("version: %v", err)
		}
	}
}

// TestExpiryRoundTrip: an expiry travels as "exp"; a message without one has
// no "exp" and decodes with none.
func TestExpiryRoundTrip(t *testing.T) {
	exp := time.Date(2030, 1, 2, 3, 4, 5, 678901000, time.UTC)
	b, err := Encode(Event{EventID: "e1", Topic: "orders", Key: "e1", ExpiresAt: exp, Payload: []byte{}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(b)
	if err != nil || !got.ExpiresAt.Equal(exp) {
		t.Fatalf("ExpiresAt %s, %v; want %s", got.ExpiresAt, err, exp)
	}
	b, err = Encode(Event{EventID: "e2", Topic: "orders", Key: "e2", Payload: []byte{}})
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, []byte(`"exp"`)) {
		t.Fatalf("no expiry, yet %s", b)
	}
	if got, err := Decode(b); err != nil || !got.ExpiresAt.IsZero() {
		t.Fatalf("ExpiresAt %s, %v; want none", got.ExpiresAt, err)
	}
}

// TestTraceContextRoundTrip: the producer's trace context travels in the WAL
// message; an unusable one is ignored, never refusing the event; a message
// without one (older producers, pgrelay.emit) has none.
func TestTraceContextRoundTrip(t *testing.T) {
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	m := Event{EventID: "e1", Topic: "orders", Key: "k", OccurredAt: time.Unix(1, 0).UTC(), TraceParent: tp, TraceState: "a=1"}
	b, err := Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.TraceParent != tp || got.TraceState != "a=1" {
		t.Fatalf("trace context %q/%q", got.TraceParent, got.TraceState)
	}
	got, err = Decode([]byte(`{"v":1,"id":"e2","topic":"orders","at":"2026-01-02T03:04:05Z","payload":"","traceparent":"00-x\n"}`))
	if err != nil {
		t.Fatal(err)
	}
	if got.TraceParent != "" {
		t.Fatalf("an unusable trace context was kept: %q", got.TraceParent)
	}
	got, err = Decode([]byte(`{"v":1,"id":"e4","topic":"orders","at":"2026-01-02T03:04:05Z","payload":"","headers":{"traceparent":"` + tp + `","x":"1"}}`))
	if err != nil || got.TraceParent != tp || len(got.Headers) != 1 {
		t.Fatalf("pgrelay.emit's headers: %+v %v", got, err)
	}
	got, err = Decode([]byte(`{"v":1,"id":"e3","topic":"orders","at":"2026-01-02T03:04:05Z","payload":""}`))
	if err != nil || got.TraceParent != "" || got.TraceState != "" {
		t.Fatalf("%+v %v", got, err)
	}
}

// TestFromRow: a row of pgrelay.outbox_wal becomes the event an emitted
// message with the same fields becomes; headers that are not an object of
// strings, a missing topic or event id are refused.
func TestFromRow(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 123456000, time.UTC)
	m, err := FromRow(Row{EventID: "e1", Topic: "orders", Payload: []byte("x"), OccurredAt: at,
		Headers: []byte(`{"Pgrelay-Content-Type":"application/json","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","X":"y"}`)})
	require.NoError(t, err)
	require.Equal(t, "e1", m.Key, "the key defaults to the event id")
	require.Equal(t, "application/json", m.ContentType)
	require.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", m.TraceParent)
	require.Equal(t, map[string]string{"X": "y"}, m.Headers)
	require.Equal(t, at, m.OccurredAt)

	for _, r := range []Row{
		{EventID: "e1", Topic: "orders", Headers: []byte(`{"n":1}`)},
		{EventID: "e1", Topic: "orders", Headers: []byte(`[]`)},
		{EventID: "e1"},
		{Topic: "orders"},
	} {
		_, err := FromRow(r)
		require.Error(t, err, "%+v", r)
	}
}

// TestVerify: a signed message verifies under its key and yields the event;
// an unsigned, altered, wrongly keyed or malformed one is refused with its
// reason.
func TestVerify(t *testing.T) {
	keys := map[int32][]byte{1: []byte("k1"), 2: []byte("k2")}
	body := []byte(`{"v":1,"id":"e","topic":"t","payload":""}`)
	signed := Sign(body, 2, keys[2])
	got, kid, err := Verify(signed, keys)
	require.NoError(t, err)
	require.Equal(t, body, got)
	require.Equal(t, int32(2), kid)

	altered := bytes.Replace(signed, []byte(`"t"`), []byte(`"u"`), 1)
	for name, c := range map[string]struct {
		content []byte
		want    error
	}{
		"unsigned":      {body, ErrUnsigned},
		"empty":         {nil, ErrUnsigned},
		"altered":       {altered, ErrBadSignature},
		"other key":     {Sign(body, 1, keys[2]), ErrBadSignature},
		"unknown key":   {Sign(body, 3, keys[2]), ErrUnknownKey},
		"short mac":     {[]byte("hmac-sha256:1:00\n{}"), ErrBadSignature},
		"not hex":       {append([]byte("hmac-sha256:1:"+strings.Repeat("zz", 32)+"\n"), body...), ErrBadSignature},
		"no key id":     {append([]byte("hmac-sha256::"+strings.Repeat("00", 32)+"\n"), body...), ErrBadSignature},
		"no line break": {signed[:bytes.IndexByte(signed, '\n')], ErrUnsigned},
	} {
		_, _, err := Verify(c.content, keys)
		require.ErrorIs(t, err, c.want, name)
	}
}
