package pgrelay

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

func keyOf(t *testing.T, spec string, m Message) (string, error) {
	t.Helper()
	s, err := parseKeyStrategy(spec)
	require.NoError(t, err, spec)
	return s.Key(m)
}

// TestKeyStrategies: each strategy builds the documented key, and a payload
// lacking a named field is an error naming the field, never another key.
func TestKeyStrategies(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 23, 10, 42, 0, 0, time.UTC)
	m := Message{EventID: "e1", EventType: "OrderPaid", OccurredAt: at,
		Headers: map[string]string{"Producer-Id": "shop-7"},
		Payload: []byte(`{"order_id":"o-42","amount_cents":1250,"currency":"EUR","customer":{"id":7},"ok":true}`)}

	k, err := keyOf(t, "", m)
	require.NoError(t, err)
	require.Equal(t, "e1", k)
	k, err = keyOf(t, "message-id", m)
	require.NoError(t, err)
	require.Equal(t, "e1", k)

	k, err = keyOf(t, "business:payment:{order_id}", m)
	require.NoError(t, err)
	require.Equal(t, "payment:o-42", k)
	k, err = keyOf(t, "business:{order_id}", m)
	require.NoError(t, err)
	require.Equal(t, "OrderPaid:o-42", k, "a template without an operation is scoped by the event type")
	k, err = keyOf(t, "business:charge:{customer.id}/{amount_cents}/{ok}", m)
	require.NoError(t, err)
	require.Equal(t, "charge:7/1250/true", k)
	k, err = keyOf(t, "business:c:{customer}", m)
	require.NoError(t, err)
	require.Equal(t, `c:{"id":7}`, k)

	whole, err := keyOf(t, "content-hash", m)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(whole, "OrderPaid:sha256:"), whole)
	reordered := m
	reordered.EventID = "e2"
	reordered.Payload = []byte(" { \"ok\" : true, \"customer\":{\"id\":7},\"currency\":\"\\u0045UR\",\"amount_cents\":1250,\"order_id\":\"o-42\"}\n")
	again, err := keyOf(t, "content-hash", reordered)
	require.NoError(t, err)
	require.Equal(t, whole, again, "member order, white space and escapes do not change the content hash")

	fields, err := keyOf(t, "content-hash:amount_cents,currency", m)
	require.NoError(t, err)
	other := m
	other.Payload = []byte(`{"order_id":"o-99","amount_cents":1250,"currency":"EUR"}`)
	same, err := keyOf(t, "content-hash:amount_cents,currency", other)
	require.NoError(t, err)
	require.Equal(t, fields, same, "only the chosen fields are hashed")
	require.NotEqual(t, whole, fields)

	hour, err := keyOf(t, "hybrid:content-hash@1h", m)
	require.NoError(t, err)
	require.Equal(t, whole+"@2026-11-23T10:00:00Z", hour)
	later := m
	later.OccurredAt = at.Add(time.Hour)
	next, err := keyOf(t, "hybrid:content-hash@1h", later)
	require.NoError(t, err)
	require.NotEqual(t, hour, next, "the next hour's bucket is another key")
	prod, err := keyOf(t, "hybrid:content-hash:amount_cents@header:Producer-Id", m)
	require.NoError(t, err)
	require.True(t, strings.HasSuffix(prod, "@Producer-Id=shop-7"), prod)

	// Missing fields: an error naming the field, never a fallback key.
	for spec, want := range map[string]string{
		"business:payment:{order_ref}":         "payload lacks field order_ref",
		"business:x:{customer.name}":           "payload lacks field customer.name",
		"content-hash:amount_cents,tax":        "payload lacks field tax",
		"hybrid:content-hash@header:Tenant-Id": "lacks the producer header Tenant-Id",
	} {
		_, err := keyOf(t, spec, m)
		require.ErrorContains(t, err, want, spec)
		var ke *keyError
		require.ErrorAs(t, err, &ke)
	}
	notJSON := m
	notJSON.Payload = []byte("not json")
	_, err = keyOf(t, "business:p:{order_id}", notJSON)
	require.ErrorContains(t, err, "not JSON")
	dupMember := m
	dupMember.Payload = []byte(`{"order_id":"a","order_id":"b"}`)
	_, err = keyOf(t, "business:p:{order_id}", dupMember)
	require.ErrorContains(t, err, `member "order_id" appears twice`)
	long := m
	long.Payload = []byte(`{"order_id":"` + strings.Repeat("x", 600) + `"}`)
	_, err = keyOf(t, "business:p:{order_id}", long)
	require.ErrorContains(t, err, "longer than 512")
	ctl := m
	ctl.Payload = []byte(`{"order_id":"a\nb"}`)
	_, err = keyOf(t, "business:p:{order_id}", ctl)
	require.ErrorContains(t, err, "control characters")
}

// TestParseKeyStrategyRefusesBadSpecs: every malformed spec is an error that
// quotes it.
func TestParseKeyStrategyRefusesBadSpecs(t *testing.T) {
	t.Parallel()
	for _, spec := range []string{
		"business:", "business:payment", "business:payment:{order_id", "business:p:{}", "business:p:{a b}",
		"business:!x:{a}", "business:p:}{a}", "content-hash:", "content-hash:a,,b", "content-hash:a,a",
		"hybrid:content-hash", "hybrid:content-hash@", "hybrid:content-hash@0s", "hybrid:content-hash@1500ms",
		"hybrid:content-hash@soon", "hybrid:business:{a}@1h", "hybrid:content-hash@header:", "sha1", "message-id:x",
		"business:p:{a}\nx",
	} {
		_, err := parseKeyStrategy(spec)
		require.Error(t, err, spec)
		require.Contains(t, err.Error(), "dedup key strategy", spec)
	}
	for _, spec := range []string{"message-id", "business:payment:{order_id}", "content-hash", "content-hash:a,b.c",
		"hybrid:content-hash@1h", "hybrid:content-hash:a@24h", "hybrid:content-hash@header:Producer-Id"} {
		s, err := parseKeyStrategy(spec)
		require.NoError(t, err, spec)
		require.Equal(t, spec, s.String())
	}
}

// FuzzKeyStrategy: parsing never panics; a parsed strategy's String parses
// back to the same strategy; a key, when built, is deterministic and valid,
// and a failure is a *KeyError.
func FuzzKeyStrategy(f *testing.F) {
	f.Add("business:payment:{order_id}", []byte(`{"order_id":"o-1"}`), "OrderPaid", int64(0))
	f.Add("content-hash", []byte(`{"b":[1,2,{"c":null}],"a":"x"}`), "T", int64(1))
	f.Add("content-hash:amount,currency", []byte(`{"amount":1.50,"currency":"EUR"}`), "", int64(2))
	f.Add("hybrid:content-hash@1h", []byte(`"just a string"`), "T", int64(3e9))
	f.Add("hybrid:content-hash@header:P", []byte(`{}`), "T", int64(-5))
	f.Add("business:{a.b}", []byte(`{"a":{"b":false}}`), "T", int64(0))
	f.Add("message-id", []byte{0xff, 0x00}, "T", int64(0))
	f.Fuzz(func(t *testing.T, spec string, payload []byte, typ string, secs int64) {
		s, err := parseKeyStrategy(spec)
		if err != nil {
			return
		}
		back, err := parseKeyStrategy(s.String())
		require.NoError(t, err)
		require.Equal(t, s.String(), back.String())
		m := Message{EventID: "e", EventType: typ, Payload: payload,
			OccurredAt: time.Unix(secs%(1<<33), 0), Headers: map[string]string{"P": "p"}}
		k1, err1 := s.Key(m)
		k2, err2 := s.Key(m)
		require.Equal(t, k1, k2, "deterministic")
		require.Equal(t, err1 == nil, err2 == nil)
		if err1 != nil {
			var ke *keyError
			require.ErrorAs(t, err1, &ke)
			return
		}
		if s.IsMessageID() {
			require.Equal(t, "e", k1)
			return
		}
		require.NoError(t, validateDedupKey(k1))
		require.True(t, utf8.ValidString(k1))
	})
}

// FuzzCanonicalJSON: canonicalisation is idempotent, yields valid JSON equal
// in value to the input, and ignores member order and white space.
func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{`{"b":1,"a":[true,null,"x"]}`, ` [ 1 , 2.50 , -0 , 1e3 ] `, `"\u00e9\ud83d\ude00"`,
		`{"a":{"b":{"c":{}}}}`, `{"a":1,"a":2}`, `{"x":"\u0000\n"}`, `nope`, `{} {}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := canonicalJSON(b)
		if err != nil {
			return
		}
		require.True(t, json.Valid(c), "canonical form is JSON: %q", c)
		again, err := canonicalJSON(c)
		require.NoError(t, err)
		require.Equal(t, c, again, "idempotent")
		// Numbers compared as written: CanonicalJSON keeps them verbatim,
		// including those beyond float64 (1e400, 400 digits), which
		// json.Unmarshal into any refuses.
		decode := func(b []byte) any {
			d := json.NewDecoder(bytes.NewReader(b))
			d.UseNumber()
			var v any
			require.NoError(t, d.Decode(&v))
			return v
		}
		require.Equal(t, decode(b), decode(c), "same value")
		// Re-indenting the input does not change its canonical form.
		var ind bytes.Buffer
		if json.Indent(&ind, b, " ", "\t") == nil {
			c2, err := canonicalJSON(ind.Bytes())
			require.NoError(t, err)
			require.Equal(t, c, c2)
		}
	})
}

// TestHybridBucketsCountFromTheUnixEpoch: a hybrid time bucket starts at a
// whole number of buckets after 1970-01-01T00:00:00Z, as documented, also
// for a bucket that does not divide a day (7h) and before 1970; for every
// bucket that divides a day the key is the one Go's time.Truncate (which
// counts from year 1) gave, so no stored key changes.
func TestHybridBucketsCountFromTheUnixEpoch(t *testing.T) {
	t.Parallel()
	m := Message{EventID: "e1", EventType: "OrderPaid", Payload: []byte(`{"a":1}`)}
	base, err := keyOf(t, "content-hash", m)
	require.NoError(t, err)
	times := []time.Time{
		time.Date(2026, 11, 23, 10, 42, 7, 123, time.UTC),
		time.Date(2026, 11, 23, 23, 59, 59, 999999999, time.UTC),
		time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(1969, 12, 31, 20, 0, 0, 1, time.UTC),
		time.Date(1901, 3, 4, 5, 6, 7, 0, time.FixedZone("x", 3600)),
		time.Date(2999, 12, 31, 23, 0, 0, 0, time.UTC),
	}
	for i := range 200 {
		times = append(times, time.Unix(int64(i)*7919*3607-400_000_000, int64(i)*1_000_003))
	}
	bucketOf := func(d time.Duration, at time.Time) string {
		m := m
		m.OccurredAt = at
		k, err := keyOf(t, "hybrid:content-hash@"+d.String(), m)
		require.NoError(t, err)
		rest, ok := strings.CutPrefix(k, base+"@")
		require.True(t, ok, k)
		return rest
	}
	for _, d := range []time.Duration{7 * time.Hour, 5 * time.Hour, 7 * time.Second, 72 * time.Hour, 100 * time.Minute} {
		for _, at := range times {
			got, err := time.Parse(time.RFC3339, bucketOf(d, at))
			require.NoError(t, err)
			require.False(t, got.After(at), "%s bucket of %s starts at %s, after it", d, at, got)
			require.True(t, at.Before(got.Add(d)), "%s bucket of %s starts at %s, a bucket or more before it", d, at, got)
			require.Zero(t, got.Unix()%int64(d/time.Second), "%s bucket of %s starts at %s, not a whole number of buckets after the Unix epoch", d, at, got)
		}
	}
	require.Equal(t, "2026-11-23T09:00:00Z", bucketOf(7*time.Hour, time.Date(2026, 11, 23, 10, 42, 0, 0, time.UTC)),
		"71247 whole 7h buckets after the epoch (time.Truncate gave 07:00)")
	for _, d := range []time.Duration{time.Second, 45 * time.Second, time.Minute, 15 * time.Minute, 90 * time.Minute,
		time.Hour, 2 * time.Hour, 3 * time.Hour, 6 * time.Hour, 8 * time.Hour, 12 * time.Hour, 24 * time.Hour} {
		require.Zero(t, 24*time.Hour%d)
		for _, at := range times {
			require.Equal(t, at.UTC().Truncate(d).Format(time.RFC3339), bucketOf(d, at),
				"%s divides a day: the key is unchanged", d)
		}
	}
}

// TestBusinessKeysAreUnambiguous: two events whose business fields differ
// never share a key, even when a value contains the template's separator or
// the event type (which scopes a template starting with a field) contains
// ':'; templates whose fields touch, which nothing could keep apart, are
// refused at start-up. Values without the separator or '\' keep the key they
// always had.
func TestBusinessKeysAreUnambiguous(t *testing.T) {
	t.Parallel()
	msg := func(typ string, fields map[string]string) Message {
		p, err := json.Marshal(fields)
		require.NoError(t, err)
		return Message{EventID: "e", EventType: typ, Payload: p}
	}
	mustKey := func(spec string, m Message) string {
		k, err := keyOf(t, spec, m)
		require.NoError(t, err, spec)
		return k
	}

	const report = "business:report:{date}:{region}"
	a := mustKey(report, msg("R", map[string]string{"date": "2026:11", "region": "eu"}))
	b := mustKey(report, msg("R", map[string]string{"date": "2026", "region": "11:eu"}))
	require.NotEqual(t, a, b, "a separator inside a value must not move the boundary")
	require.Equal(t, `report:2026\:11:eu`, a, "the separator is escaped in the value it follows")
	require.Equal(t, "report:2026:11:eu", b, "the last value is never escaped: nothing follows it")

	a = mustKey("business:{order_id}", msg("a:b", map[string]string{"order_id": "c"}))
	b = mustKey("business:{order_id}", msg("a", map[string]string{"order_id": "b:c"}))
	require.NotEqual(t, a, b, "the event type scoping the template is kept apart from the first value")

	// Unchanged keys: no value holds its separator or '\'.
	require.Equal(t, "payment:o:42", mustKey("business:payment:{order_id}", msg("P", map[string]string{"order_id": "o:42"})))
	require.Equal(t, "P:o-42", mustKey("business:{order_id}", msg("P", map[string]string{"order_id": "o-42"})))
	require.Equal(t, "r:2026-11:eu/w", mustKey(report[:len("business:")]+"r:{date}:{region}/w", msg("R", map[string]string{"date": "2026-11", "region": "eu"})))

	for _, spec := range []string{"business:{a}{b}", "business:x:{a}{b}:y", "business:{a}:{b}{c}"} {
		_, err := parseKeyStrategy(spec)
		require.ErrorContains(t, err, "adjacent", spec)
	}

	// Exhaustively over short values made of separators, the escape and a
	// letter: distinct inputs, distinct keys.
	alphabet := []string{"a", ":", "/", `\`}
	values := []string{}
	for _, x := range alphabet {
		values = append(values, x)
		for _, y := range alphabet {
			values = append(values, x+y)
		}
	}
	for _, spec := range []string{"business:{a}:{b}/{c}", "business:x{a}/:{b}:{c}"} {
		seen := map[string]string{}
		for _, typ := range []string{"T", "T:", `T\`} {
			for _, va := range values {
				for _, vb := range values {
					for _, vc := range values {
						k := mustKey(spec, msg(typ, map[string]string{"a": va, "b": vb, "c": vc}))
						in := strings.Join([]string{typ, va, vb, vc}, "\x00")
						if spec != "business:{a}:{b}/{c}" {
							in = strings.Join([]string{va, vb, vc}, "\x00") // the type is not part of the key
						}
						if prev, ok := seen[k]; ok && prev != in {
							t.Fatalf("%s: %q and %q share the key %q", spec, prev, in, k)
						}
						seen[k] = in
					}
				}
			}
		}
	}
}
