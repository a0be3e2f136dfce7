package event

import (
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

func TestIsTextContentType(t *testing.T) {
	for ct, text := range map[string]bool{
		"": false, "application/json": true, "Application/JSON; charset=utf-8": true, "text/csv": true,
		"application/cloudevents+json": true, "application/xml": true, "application/x-protobuf": false,
		"application/octet-stream": false, "avro/binary": false, "application/jsonl-ish": false,
	} {
		require.Equal(t, text, IsTextContentType(ct), ct)
	}
}
