package httpidem_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/httpidem"
)

// FuzzFingerprint: two requests share a fingerprint exactly when their
// method, path, query and body are equal, however the parts are split.
func FuzzFingerprint(f *testing.F) {
	f.Add("POST", "/payments", "", []byte(`{"a":1}`), "POST", "/payments", "", []byte(`{"a":1}`))
	f.Add("POST", "/a", "b", []byte{}, "POST", "/ab", "", []byte{})
	f.Add("POST", "/pay", "", []byte("x"), "POS", "T/pay", "", []byte("x"))
	f.Add("PATCH", "/x", "q=1", []byte(nil), "PATCH", "/x", "q=1", []byte(""))
	f.Fuzz(func(t *testing.T, m1, p1, q1 string, b1 []byte, m2, p2, q2 string, b2 []byte) {
		a := httpidem.Fingerprint(m1, p1, q1, b1)
		require.Equal(t, a, httpidem.Fingerprint(m1, p1, q1, append([]byte(nil), b1...)), "deterministic")
		same := m1 == m2 && p1 == p2 && q1 == q2 && string(b1) == string(b2)
		require.Equal(t, same, a == httpidem.Fingerprint(m2, p2, q2, b2))
	})
}

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{`"abc"`, `abc`, `"a\"b"`, `""`, `"`, `a b`, `"a\x"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		k, err := httpidem.ParseKey(v)
		if err != nil {
			return
		}
		require.NotEmpty(t, k)
		require.LessOrEqual(t, len(k), httpidem.MaxKeyLength)
		for i := 0; i < len(k); i++ {
			require.True(t, k[i] >= 0x20 && k[i] <= 0x7e)
		}
	})
}
