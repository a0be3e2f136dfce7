package pgrelay

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// DefaultHandlerName is the handler name used when none is given; inbox rows
// stored before handlers were named belong to it.
const DefaultHandlerName = "default"

// maxDedupKeyLen is the longest dedup key a strategy may build, in bytes.
const maxDedupKeyLen = 512

var handlerNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// ValidateHandlerName checks a handler name: 1 to 63 characters of a-z, 0-9,
// '_', '.' and '-', starting with a letter or digit (so it also fits a broker
// durable or group name).
func ValidateHandlerName(name string) error {
	if !handlerNameRE.MatchString(name) {
		return fmt.Errorf("handler name %q must be 1 to 63 characters of a-z, 0-9, '_', '.', '-', starting with a letter or digit", name)
	}
	return nil
}

// ValidateKeyStrategy checks a key strategy spec as Target.DedupKey and
// Target.DedupKeyByTopic take it ("" is the default, "message-id").
func ValidateKeyStrategy(spec string) error {
	_, err := parseKeyStrategy(spec)
	return err
}

// strategyKind names how a dedup key is built.
type strategyKind string

// The key strategies.
const (
	// keyMessageID keys an event by its event id (the default).
	keyMessageID strategyKind = "message-id"
	// keyBusiness keys it by named payload fields under an operation name
	// or the event type: "payment:{order_id}".
	keyBusiness strategyKind = "business"
	// keyContentHash keys it by the SHA-256 of the canonical JSON of chosen
	// payload fields or of the whole payload, under the event type.
	keyContentHash strategyKind = "content-hash"
	// keyHybrid is a content hash scoped by a time bucket of the event's
	// occurred-at or by a producer id carried in a header.
	keyHybrid strategyKind = "hybrid"
)

// keyStrategy builds the dedup key of an event for one handler. The zero
// value is the message-id strategy. Parse one with parseKeyStrategy.
type keyStrategy struct {
	kind strategyKind
	spec string
	// business: literal text and field references, alternating; ops[0] is
	// literal text (possibly empty).
	parts  []string
	fields [][]string // dotted paths: business placeholders or hashed fields
	// hybrid scope: a time bucket or a header naming the producer.
	bucket time.Duration
	header string
}

// Kind returns the strategy's kind.
func (s keyStrategy) Kind() strategyKind {
	if s.kind == "" {
		return keyMessageID
	}
	return s.kind
}

// String returns the strategy's spec as parseKeyStrategy accepts it, and as
// statistics show it.
func (s keyStrategy) String() string {
	if s.kind == "" {
		return string(keyMessageID)
	}
	return s.spec
}

// IsMessageID reports whether the strategy keys by event id.
func (s keyStrategy) IsMessageID() bool { return s.Kind() == keyMessageID }

// parseKeyStrategy parses a key strategy spec:
//
//	message-id                        the event id (default; also "")
//	business:payment:{order_id}       operation "payment", field order_id
//	business:{order_id}               the event type is the operation
//	business:report:{date}:{region}   several fields; dotted paths reach into objects
//	content-hash                      SHA-256 of the canonical JSON of the whole payload
//	content-hash:amount,currency      ... of the object of those fields only
//	hybrid:content-hash@1h            a content hash scoped by the hour of occurred-at
//	hybrid:content-hash:amount@24h    chosen fields, a day's bucket
//	hybrid:content-hash@header:Producer-Id   scoped by the producer id in that header
func parseKeyStrategy(spec string) (keyStrategy, error) {
	spec = strings.TrimSpace(spec)
	fail := func(format string, args ...any) (keyStrategy, error) {
		return keyStrategy{}, fmt.Errorf("dedup key strategy %q: %s", spec, fmt.Sprintf(format, args...))
	}
	if !utf8.ValidString(spec) || strings.ContainsFunc(spec, isControl) {
		return fail("contains control characters or invalid UTF-8")
	}
	switch {
	case spec == "" || spec == string(keyMessageID):
		return keyStrategy{}, nil
	case strings.HasPrefix(spec, "business:"):
		tmpl := strings.TrimPrefix(spec, "business:")
		parts, fields, err := parseTemplate(tmpl)
		if err != nil {
			return fail("%v", err)
		}
		return keyStrategy{kind: keyBusiness, spec: spec, parts: parts, fields: fields}, nil
	case spec == string(keyContentHash) || strings.HasPrefix(spec, "content-hash:"):
		fields, err := parseFieldList(strings.TrimPrefix(strings.TrimPrefix(spec, "content-hash"), ":"), spec != string(keyContentHash))
		if err != nil {
			return fail("%v", err)
		}
		return keyStrategy{kind: keyContentHash, spec: spec, fields: fields}, nil
	case strings.HasPrefix(spec, "hybrid:"):
		rest := strings.TrimPrefix(spec, "hybrid:")
		base, scope, ok := strings.Cut(rest, "@")
		if !ok || scope == "" {
			return fail("a hybrid strategy needs a scope: @<duration> (for example @1h) or @header:<name>")
		}
		if base != string(keyContentHash) && !strings.HasPrefix(base, "content-hash:") {
			return fail("a hybrid strategy scopes a content hash: hybrid:content-hash[:fields]@scope")
		}
		fields, err := parseFieldList(strings.TrimPrefix(strings.TrimPrefix(base, "content-hash"), ":"), base != string(keyContentHash))
		if err != nil {
			return fail("%v", err)
		}
		s := keyStrategy{kind: keyHybrid, spec: spec, fields: fields}
		if h, ok := strings.CutPrefix(scope, "header:"); ok {
			if h == "" || strings.ContainsAny(h, " \t:@{}") {
				return fail("header name %q is empty or contains spaces, ':', '@' or braces", h)
			}
			s.header = h
			return s, nil
		}
		d, err := time.ParseDuration(scope)
		if err != nil {
			return fail("scope %q is neither a duration (30m, 1h, 24h) nor header:<name>", scope)
		}
		if d < time.Second || d%time.Second != 0 {
			return fail("time bucket %s must be a whole number of seconds, at least 1s", d)
		}
		s.bucket = d
		return s, nil
	default:
		return fail("unknown strategy; want message-id, business:<template>, content-hash[:fields] or hybrid:content-hash[:fields]@<scope>")
	}
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

// parseTemplate splits a business key template into literal parts and field
// references: "payment:{order_id}" → parts ["payment:", ""], fields
// [[order_id]]. A template that starts with a field is prefixed with the
// event type at build time.
func parseTemplate(tmpl string) (parts []string, fields [][]string, err error) {
	if tmpl == "" {
		return nil, nil, errors.New("the business key template is empty; want for example payment:{order_id}")
	}
	if strings.HasPrefix(tmpl, "!") {
		return nil, nil, errors.New("a business key template must not start with '!' (reserved)")
	}
	rest := tmpl
	lit := ""
	for rest != "" {
		i := strings.IndexAny(rest, "{}")
		if i < 0 {
			lit += rest
			break
		}
		if rest[i] == '}' {
			return nil, nil, fmt.Errorf("unmatched '}' in template %q", tmpl)
		}
		lit += rest[:i]
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			return nil, nil, fmt.Errorf("unclosed '{' in template %q", tmpl)
		}
		path, err := parsePath(rest[i+1 : i+j])
		if err != nil {
			return nil, nil, err
		}
		if len(fields) > 0 && lit == "" {
			return nil, nil, fmt.Errorf("fields {%s} and {%s} are adjacent in template %q: their values could not be told apart (\"ab\"+\"c\" and \"a\"+\"bc\" give one key); put a separator between them, for example {%[1]s}:{%[2]s}",
				strings.Join(fields[len(fields)-1], "."), strings.Join(path, "."), tmpl)
		}
		parts = append(parts, lit)
		fields = append(fields, path)
		lit = ""
		rest = rest[i+j+1:]
	}
	parts = append(parts, lit)
	if len(fields) == 0 {
		return nil, nil, fmt.Errorf("template %q names no payload field; want for example payment:{order_id}", tmpl)
	}
	return parts, fields, nil
}

var fieldRE = regexp.MustCompile(`^[A-Za-z0-9_$-]+$`)

// parsePath parses a dotted field path: order_id, customer.id.
func parsePath(p string) ([]string, error) {
	segs := strings.Split(strings.TrimSpace(p), ".")
	for _, s := range segs {
		if !fieldRE.MatchString(s) {
			return nil, fmt.Errorf("field %q: want names of A-Z, a-z, 0-9, '_', '-', '$', separated by '.'", p)
		}
	}
	return segs, nil
}

// parseFieldList parses "amount,currency"; required says the list was
// announced by a ':' and must not be empty.
func parseFieldList(list string, required bool) ([][]string, error) {
	if list == "" {
		if required {
			return nil, errors.New("the field list after ':' is empty")
		}
		return nil, nil
	}
	var out [][]string
	seen := map[string]bool{}
	for _, f := range strings.Split(list, ",") {
		path, err := parsePath(f)
		if err != nil {
			return nil, err
		}
		name := strings.Join(path, ".")
		if seen[name] {
			return nil, fmt.Errorf("field %q is listed twice", name)
		}
		seen[name] = true
		out = append(out, path)
	}
	return out, nil
}

// keyError says why a strategy could not build an event's key; the event is
// then stored dead with it as the reason, never keyed by something else.
type keyError struct {
	Strategy string
	Err      error
}

func (e *keyError) Error() string { return "dedup key (" + e.Strategy + "): " + e.Err.Error() }
func (e *keyError) Unwrap() error { return e.Err }

// Key builds m's dedup key. For the message-id strategy it is the event id.
func (s keyStrategy) Key(m Message) (string, error) {
	if s.IsMessageID() {
		return m.EventID, nil
	}
	k, err := s.build(m)
	if err != nil {
		return "", &keyError{Strategy: s.String(), Err: err}
	}
	if err := validateDedupKey(k); err != nil {
		return "", &keyError{Strategy: s.String(), Err: err}
	}
	return k, nil
}

// validateDedupKey checks a key a strategy built: at most maxDedupKeyLen
// bytes of valid UTF-8 without control characters, not starting with '!'
// (reserved for events whose key could not be built).
func validateDedupKey(k string) error {
	switch {
	case k == "":
		return errors.New("the key is empty")
	case len(k) > maxDedupKeyLen:
		return fmt.Errorf("the key is %d bytes, longer than %d", len(k), maxDedupKeyLen)
	case !utf8.ValidString(k):
		return errors.New("the key is not valid UTF-8")
	case strings.ContainsFunc(k, isControl):
		return errors.New("the key contains control characters")
	case strings.HasPrefix(k, "!"):
		return errors.New("the key starts with '!' (reserved)")
	}
	return nil
}

func (s keyStrategy) build(m Message) (string, error) {
	doc, err := decodeStrict(m.Payload)
	if err != nil {
		return "", fmt.Errorf("payload: %w", err)
	}
	switch s.kind {
	case keyBusiness:
		// Every value but the last is escaped against the first character
		// of the literal text that follows it (see escapeValue), so the
		// key decodes to one tuple of values: different values, different
		// keys. The last value needs nothing: the rest of the key is it.
		var b strings.Builder
		if s.parts[0] == "" {
			if m.EventType == "" {
				return "", errors.New("the template starts with a field and the event has no event type to scope it")
			}
			b.WriteString(escapeValue(m.EventType, ':'))
			b.WriteByte(':')
		}
		for i, path := range s.fields {
			b.WriteString(s.parts[i])
			v, err := lookup(doc, path)
			if err != nil {
				return "", err
			}
			text, err := fieldText(v)
			if err != nil {
				return "", fmt.Errorf("field %s: %w", strings.Join(path, "."), err)
			}
			if i < len(s.fields)-1 {
				sep, _ := utf8.DecodeRuneInString(s.parts[i+1]) // never empty: adjacent fields are refused
				text = escapeValue(text, sep)
			}
			b.WriteString(text)
		}
		b.WriteString(s.parts[len(s.parts)-1])
		return b.String(), nil
	case keyContentHash, keyHybrid:
		sum, err := contentHash(doc, s.fields)
		if err != nil {
			return "", err
		}
		typ := m.EventType
		if typ == "" {
			typ = "-"
		}
		key := typ + ":sha256:" + sum
		if s.kind == keyHybrid {
			if s.header != "" {
				v := m.Headers[s.header]
				if v == "" {
					return "", fmt.Errorf("the event lacks the producer header %s", s.header)
				}
				key += "@" + s.header + "=" + v
			} else {
				at := m.OccurredAt
				if at.IsZero() {
					return "", errors.New("the event has no occurred-at to bucket")
				}
				key += "@" + bucketStart(at, s.bucket).Format(time.RFC3339)
			}
		}
		return key, nil
	}
	return "", fmt.Errorf("unknown strategy kind %q", s.kind)
}

// bucketStart is the start of the bucket of length d (whole seconds, at
// least 1s) holding at: a whole number of buckets after the Unix epoch,
// 1970-01-01T00:00:00Z, as documented. (time.Truncate counts from Go's zero
// time, year 1: the same instants for every d that divides a day, other
// ones for a d such as 7h.)
func bucketStart(at time.Time, d time.Duration) time.Time {
	secs, n := at.Unix(), int64(d/time.Second) // Unix rounds down: nanoseconds are in [0, 1e9)
	q := secs / n
	if secs%n < 0 {
		q-- // floor, also before 1970
	}
	return time.Unix(q*n, 0).UTC()
}

// keyEscape escapes, in a business key's value, itself and the separator
// that follows the value.
const keyEscape = '\\'

// escapeValue returns v with every keyEscape and every sep prefixed by
// keyEscape, or v itself when it holds neither: the keys of values without
// the separator or '\' are the ones earlier releases built, and only keys
// that could collide ("report:{date}:{region}" with date "2026:11" and
// region "eu", or date "2026" and region "11:eu") change.
func escapeValue(v string, sep rune) string {
	if !strings.ContainsRune(v, keyEscape) && !strings.ContainsRune(v, sep) {
		return v
	}
	var b strings.Builder
	for _, r := range v {
		if r == keyEscape || r == sep {
			b.WriteRune(keyEscape)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// contentHash is the hex SHA-256 of the canonical JSON of doc, or of the
// object holding only the given fields (each under its full dotted name).
func contentHash(doc any, fields [][]string) (string, error) {
	var subject any = doc
	if len(fields) > 0 {
		obj := make(map[string]any, len(fields))
		for _, path := range fields {
			v, err := lookup(doc, path)
			if err != nil {
				return "", err
			}
			obj[strings.Join(path, ".")] = v
		}
		subject = obj
	}
	var buf bytes.Buffer
	if err := writeCanonical(&buf, subject); err != nil {
		return "", err
	}
	sum := sha256.Sum256(buf.Bytes())
	return hex.EncodeToString(sum[:]), nil
}

// lookup finds a dotted path in a decoded document; a missing field, or one
// that is null, is an error.
func lookup(doc any, path []string) (any, error) {
	v := doc
	for i, seg := range path {
		obj, ok := v.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("payload lacks field %s (%s is not an object)", strings.Join(path, "."), describePath(path[:i]))
		}
		v, ok = obj[seg]
		if !ok || v == nil {
			return nil, fmt.Errorf("payload lacks field %s", strings.Join(path, "."))
		}
	}
	return v, nil
}

func describePath(p []string) string {
	if len(p) == 0 {
		return "the payload"
	}
	return strings.Join(p, ".")
}

// fieldText is a field's value as it appears in a business key: a string as
// is (not empty), a number as written, true/false, and an object or array as
// its canonical JSON.
func fieldText(v any) (string, error) {
	switch x := v.(type) {
	case string:
		if x == "" {
			return "", errors.New("is empty")
		}
		return x, nil
	case json.Number:
		return x.String(), nil
	case bool:
		if x {
			return "true", nil
		}
		return "false", nil
	default:
		var buf bytes.Buffer
		if err := writeCanonical(&buf, v); err != nil {
			return "", err
		}
		return buf.String(), nil
	}
}

// maxJSONDepth bounds the nesting decodeStrict accepts.
const maxJSONDepth = 200

// decodeStrict decodes one JSON value: numbers kept as written, objects as
// maps. It refuses what would make two different payloads look alike or one
// payload ambiguous: invalid UTF-8, duplicate member names, trailing data,
// and nesting deeper than maxJSONDepth.
func decodeStrict(b []byte) (any, error) {
	if !utf8.Valid(b) {
		return nil, errors.New("not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	v, err := decodeValue(dec, 0)
	if err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("not JSON: data after the value")
	}
	return v, nil
}

func decodeValue(dec *json.Decoder, depth int) (any, error) {
	if depth > maxJSONDepth {
		return nil, fmt.Errorf("nested deeper than %d", maxJSONDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			obj := map[string]any{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k, ok := kt.(string)
				if !ok {
					return nil, errors.New("object key is not a string")
				}
				if _, dup := obj[k]; dup {
					return nil, fmt.Errorf("member %q appears twice", k)
				}
				v, err := decodeValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				obj[k] = v
			}
			if _, err := dec.Token(); err != nil {
				return nil, err
			}
			return obj, nil
		case '[':
			arr := []any{}
			for dec.More() {
				v, err := decodeValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				arr = append(arr, v)
			}
			if _, err := dec.Token(); err != nil {
				return nil, err
			}
			return arr, nil
		}
		return nil, fmt.Errorf("unexpected %v", t)
	default:
		return t, nil // string, json.Number, bool or nil
	}
}

// canonicalJSON returns the canonical form of a JSON document: object members
// sorted by name (byte order), no insignificant white space, strings escaped
// the same way whatever their source escaping, numbers as written (so 1.0 and
// 1 differ). It fails on what decodeStrict refuses. Two payloads with the same
// canonical form are the same document.
func canonicalJSON(b []byte) ([]byte, error) {
	doc, err := decodeStrict(b)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := writeCanonical(&buf, doc); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func writeCanonical(buf *bytes.Buffer, v any) error {
	switch x := v.(type) {
	case nil:
		buf.WriteString("null")
	case bool:
		if x {
			buf.WriteString("true")
		} else {
			buf.WriteString("false")
		}
	case json.Number:
		buf.WriteString(x.String())
	case string:
		writeString(buf, x)
	case []any:
		buf.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := writeCanonical(buf, e); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		buf.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				buf.WriteByte(',')
			}
			writeString(buf, k)
			buf.WriteByte(':')
			if err := writeCanonical(buf, x[k]); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
	default:
		return fmt.Errorf("unexpected JSON value %T", v)
	}
	return nil
}

// writeString writes s as a JSON string: '"' and '\' escaped, control
// characters as \uXXXX (\n, \r, \t, \b, \f by name), everything else as
// UTF-8.
func writeString(buf *bytes.Buffer, s string) {
	buf.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			buf.WriteString(`\"`)
		case '\\':
			buf.WriteString(`\\`)
		case '\n':
			buf.WriteString(`\n`)
		case '\r':
			buf.WriteString(`\r`)
		case '\t':
			buf.WriteString(`\t`)
		case '\b':
			buf.WriteString(`\b`)
		case '\f':
			buf.WriteString(`\f`)
		default:
			if r < 0x20 {
				fmt.Fprintf(buf, `\u%04x`, r)
			} else {
				buf.WriteRune(r)
			}
		}
	}
	buf.WriteByte('"')
}

// payloadFingerprint is the SHA-256 of a payload's bytes, as the inbox stores it
// (the fingerprint column) to tell a redelivery from a key conflict.
func payloadFingerprint(payload []byte) []byte {
	sum := sha256.Sum256(payload)
	return sum[:]
}
