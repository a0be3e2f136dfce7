package cli

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
)

// FuzzEnv sets a typed setting's environment variable to arbitrary text:
// ValidateEnv rejects exactly the values the Env helpers cannot parse, naming
// the variable, and the helpers then fall back to their default instead of
// failing or panicking.
func FuzzEnv(f *testing.F) {
	for _, s := range []string{"42", "-1", "lots", "", " 1", "1e3", "9999999999999999999999", "30s", "1h2m3.5s", "-5ms", "1d",
		"true", "FALSE", "yes", "t", "0x10", "\x00", "\xff\xfe", "1\n2", strings.Repeat("9", 400)} {
		f.Add(s)
	}
	const name = "PGRELAY_FUZZ_SETTING"
	f.Fuzz(func(t *testing.T, v string) {
		if strings.ContainsRune(v, 0) {
			t.Skip("the environment cannot hold NUL bytes")
		}
		t.Setenv(name, v)
		for _, kind := range []string{"int", "number", "duration", "bool"} {
			err := ValidateEnv(map[string]string{name: kind})
			var parseErr error
			switch kind {
			case "int":
				var n int
				n, parseErr = strconv.Atoi(v)
				got := EnvInt(name, -7)
				if parseErr == nil && got != n || parseErr != nil && got != -7 {
					t.Fatalf("EnvInt(%q) = %d", v, got)
				}
			case "number":
				var x float64
				x, parseErr = strconv.ParseFloat(v, 64)
				got := EnvFloat(name, -7)
				if parseErr == nil && got != x && !math.IsNaN(x) || parseErr != nil && got != -7 {
					t.Fatalf("EnvFloat(%q) = %g", v, got)
				}
			case "duration":
				var d time.Duration
				d, parseErr = time.ParseDuration(v)
				got := EnvDuration(name, -7)
				if parseErr == nil && got != d || parseErr != nil && got != -7 {
					t.Fatalf("EnvDuration(%q) = %s", v, got)
				}
			case "bool":
				var b bool
				b, parseErr = strconv.ParseBool(v)
				got := EnvBool(name, true)
				if parseErr == nil && got != b || parseErr != nil && !got {
					t.Fatalf("EnvBool(%q) = %v", v, got)
				}
			}
			if (err == nil) != (parseErr == nil) {
				t.Fatalf("ValidateEnv(%s=%q as %s) = %v, parse error %v", name, v, kind, err, parseErr)
			}
			if err != nil && !strings.Contains(err.Error(), name) {
				t.Fatalf("error does not name the variable: %v", err)
			}
		}
		if EnvString(name, "default") != v {
			t.Fatalf("EnvString lost the value %q", v)
		}
	})
}

// FuzzNewLogger checks that any log level and format either builds a logger
// or fails with an error naming what was wrong, never a panic.
func FuzzNewLogger(f *testing.F) {
	for _, s := range [][2]string{{"info", "json"}, {"debug", "console"}, {"loud", "json"}, {"info", "xml"}, {"", ""}, {"\xff", "\x00"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, level, format string) {
		l, err := NewLogger(level, format)
		if err == nil {
			if l == nil {
				t.Fatal("no logger and no error")
			}
			return
		}
		if err.Error() == "" {
			t.Fatal("an error without a message")
		}
	})
}
