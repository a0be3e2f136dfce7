package event

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestValidateEventID(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		id   string
		want error
	}{
		{"uuid", "0190a5d2-7a57-7c1e-9b1e-3f0c2d1e4a5b", nil},
		{"free-form", "nats:PGRELAY:42", nil},
		{"max length", strings.Repeat("a", MaxEventIDLen), nil},
		{"empty", "", ErrMissingEventID},
		{"too long", strings.Repeat("a", MaxEventIDLen+1), ErrInvalidEventID},
		{"invalid utf-8", "abc\xff", ErrInvalidEventID},
		{"nul", "abc\x00def", ErrInvalidEventID},
		{"newline", "abc\ndef", ErrInvalidEventID},
		{"del", "abc\x7f", ErrInvalidEventID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := ValidateEventID(tc.id)
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			require.True(t, errors.Is(err, tc.want), "got %v, want %v", err, tc.want)
		})
	}
}

func FuzzValidateEventID(f *testing.F) {
	for _, s := range []string{"", "a", "0190a5d2-7a57-7c1e-9b1e-3f0c2d1e4a5b", "\x00", "\xff\xfe", strings.Repeat("x", 300)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		if err := ValidateEventID(id); err == nil {
			// Anything accepted must be storable as a text key and printable.
			require.NotEmpty(t, id)
			require.LessOrEqual(t, len(id), MaxEventIDLen)
			require.NotContains(t, id, "\x00")
		}
	})
}

// TestNormalizeOccurredAtEdges: the range is checked after rounding to the
// microsecond, so what is accepted is exactly what PostgreSQL stores.
func TestNormalizeOccurredAtEdges(t *testing.T) {
	t.Parallel()
	utc := func(y int, mo time.Month, d, h, mi, s, ns int) time.Time {
		return time.Date(y, mo, d, h, mi, s, ns, time.UTC)
	}
	cases := []struct {
		in   time.Time
		want time.Time // zero: refused
	}{
		{utc(2026, 1, 2, 3, 4, 5, 123456789), utc(2026, 1, 2, 3, 4, 5, 123457000)},
		{utc(2026, 1, 2, 3, 4, 5, 123456499), utc(2026, 1, 2, 3, 4, 5, 123456000)},
		{utc(9999, 12, 31, 23, 59, 59, 999999000), utc(9999, 12, 31, 23, 59, 59, 999999000)},
		{utc(9999, 12, 31, 23, 59, 59, 999999499), utc(9999, 12, 31, 23, 59, 59, 999999000)},
		{utc(9999, 12, 31, 23, 59, 59, 999999500), time.Time{}}, // rounds to year 10000
		{utc(9999, 12, 31, 23, 59, 59, 999999999), time.Time{}},
		{utc(10000, 1, 1, 0, 0, 0, 0), time.Time{}},
		{utc(1, 1, 1, 0, 0, 0, 1000), utc(1, 1, 1, 0, 0, 0, 1000)},
		{utc(1, 1, 1, 0, 0, 0, 500), utc(1, 1, 1, 0, 0, 0, 1000)},
		{utc(1, 1, 1, 0, 0, 0, 499), time.Time{}}, // rounds to the zero time
		{utc(1, 1, 1, 0, 0, 0, 0), time.Time{}},
		{utc(0, 12, 31, 0, 0, 0, 0), time.Time{}},
		{time.Date(2026, 6, 1, 12, 0, 0, 0, time.FixedZone("x", 3600)), utc(2026, 6, 1, 11, 0, 0, 0)},
	}
	for _, c := range cases {
		got, err := NormalizeOccurredAt(c.in)
		if c.want.IsZero() {
			require.ErrorIs(t, err, ErrOccurredAtOutOfRange, "%s", c.in)
			require.ErrorContains(t, err, "occurred_at")
			continue
		}
		require.NoError(t, err, "%s", c.in)
		require.Equal(t, c.want, got, "%s", c.in)
		require.Equal(t, time.UTC, got.Location())
	}
}

// TestCausedBy: the outputs of an event record its id as their causation and
// carry its correlation id, or its event id when it starts a chain; headers
// already set are kept, and the inputs are not modified.
func TestCausedBy(t *testing.T) {
	t.Parallel()
	start := Message{EventID: "a"}
	inChain := Message{EventID: "b", Headers: map[string]string{HeaderCorrelationID: "flow-1"}}
	require.Equal(t, "a", start.CorrelationID())
	require.Equal(t, "flow-1", inChain.CorrelationID())
	require.Empty(t, start.CausationID())

	out := Message{Topic: "t", Headers: map[string]string{"x": "1"}}
	got := CausedBy(start, out)
	require.Equal(t, map[string]string{"x": "1", HeaderCausationID: "a", HeaderCorrelationID: "a"}, got[0].Headers)
	require.Equal(t, map[string]string{"x": "1"}, out.Headers, "the input is not modified")
	got = CausedBy(inChain, out, Message{Headers: map[string]string{HeaderCorrelationID: "own"}})
	require.Equal(t, "b", got[0].CausationID())
	require.Equal(t, "flow-1", got[0].CorrelationID())
	require.Equal(t, "own", got[1].CorrelationID(), "an explicit correlation id is kept")
	require.Equal(t, "b", got[1].CausationID())

	// The same through a context.
	require.Equal(t, []Message{out}, WithCauseFromContext(context.Background(), []Message{out}))
	got = WithCauseFromContext(WithCause(context.Background(), inChain), []Message{out})
	require.Equal(t, "b", got[0].CausationID())
	require.Equal(t, "flow-1", got[0].CorrelationID())
}

func TestContentType(t *testing.T) {
	for ct, text := range map[string]bool{
		"": false, "application/json": true, "Application/JSON; charset=utf-8": true, "text/csv": true,
		"application/cloudevents+json": true, "application/xml": true, "application/x-protobuf": false,
		"application/octet-stream": false, "avro/binary": false, "application/jsonl-ish": false,
	} {
		require.Equal(t, text, IsTextContentType(ct), ct)
	}
	m := Message{ContentType: "application/x-protobuf", Headers: map[string]string{"a": "b"}}
	stored := m.StoredHeaders()
	require.Equal(t, map[string]string{"a": "b", HeaderContentType: "application/x-protobuf"}, stored)
	require.Len(t, m.Headers, 1, "StoredHeaders does not change the message")
	back := Message{Headers: stored}
	back.LiftContentType()
	require.Equal(t, m, back)
	require.Nil(t, Message{}.StoredHeaders())
}
