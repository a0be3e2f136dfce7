package event

import (
	"errors"
	"strings"
	"testing"

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
