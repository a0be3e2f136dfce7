package rabbitmq

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"time"
)

// AMQP 1.0 interoperability through RabbitMQ 3.x's rabbitmq_amqp1_0 plugin.
// The plugin does not map AMQP 0-9-1 headers to AMQP 1.0
// application-properties, either way: a 1.0 message's application-properties
// section reaches a 0-9-1 consumer as one header, AppPropertiesHeader,
// holding the section as encoded AMQP 1.0 bytes, and a 0-9-1 message's
// headers reach a 1.0 consumer only if one of them is AppPropertiesHeader,
// which the plugin then sends verbatim as the application-properties
// section. pgrelay writes and reads that header so that AMQP 1.0 clients
// (such as the CloudEvents Go SDK's AMQP binding) see the CloudEvents
// attributes as application-properties.

// AppPropertiesHeader is the AMQP 0-9-1 header in which RabbitMQ 3.x's
// AMQP 1.0 plugin carries an AMQP 1.0 application-properties section.
const AppPropertiesHeader = "x-amqp-1.0-app-properties"

// amqp10Prefix starts the names of the headers the AMQP 1.0 plugin adds
// (x-amqp-1.0-properties, -app-properties, -message-annotations, -footer).
const amqp10Prefix = "x-amqp-1.0-"

// AMQP 1.0 type codes (AMQP 1.0 part 1, section 1.6).
const (
	a10Null       = 0x40
	a10True       = 0x41
	a10False      = 0x42
	a10UInt0      = 0x43
	a10ULong0     = 0x44
	a10Bool       = 0x56
	a10SmallUInt  = 0x52
	a10SmallULong = 0x53
	a10SmallInt   = 0x54
	a10SmallLong  = 0x55
	a10UByte      = 0x50
	a10Byte       = 0x51
	a10UShort     = 0x60
	a10Short      = 0x61
	a10UInt       = 0x70
	a10Int        = 0x71
	a10ULong      = 0x80
	a10Long       = 0x81
	a10Timestamp  = 0x83
	a10Float      = 0x72
	a10Char       = 0x73
	a10Double     = 0x82
	a10UUID       = 0x98
	a10Vbin8      = 0xa0
	a10Str8       = 0xa1
	a10Sym8       = 0xa3
	a10Vbin32     = 0xb0
	a10Str32      = 0xb1
	a10Sym32      = 0xb3
	a10Map8       = 0xc1
	a10Map32      = 0xd1
	// a10AppProps is the descriptor of the application-properties section:
	// described type (0x00), smallulong 0x74.
	a10Described = 0x00
	a10AppProps  = 0x74
)

// encodeAppProperties encodes h as an AMQP 1.0 application-properties
// section: a map of string keys to string values, in key order.
func encodeAppProperties(h map[string]string) []byte {
	keys := make([]string, 0, len(h))
	body := 4 // count
	for k, v := range h {
		keys = append(keys, k)
		body += 5 + len(k) + 5 + len(v)
	}
	sort.Strings(keys)
	b := make([]byte, 0, 3+1+4+body)
	b = append(b, a10Described, a10SmallULong, a10AppProps, a10Map32)
	b = binary.BigEndian.AppendUint32(b, uint32(body))
	b = binary.BigEndian.AppendUint32(b, uint32(2*len(keys)))
	str := func(s string) {
		b = append(b, a10Str32)
		b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	for _, k := range keys {
		str(k)
		str(h[k])
	}
	return b
}

var errTruncated = errors.New("truncated")

// decodeAppProperties decodes an AMQP 1.0 application-properties section
// (as the AMQP 1.0 plugin stores it in AppPropertiesHeader) into strings:
// strings and symbols as they are, integers in decimal, booleans as
// "true"/"false", timestamps in RFC 3339 (UTC, milliseconds as AMQP keeps
// them), binary in base64 (the CloudEvents canonical string forms), floats
// in Go's shortest form, chars as text, UUIDs in their hyphenated form.
// Null values are left out. A value of another type (decimal, a list, a
// map, an array: none of them a CloudEvents type) fails the whole section.
func decodeAppProperties(b []byte) (map[string]string, error) {
	if len(b) < 3 || b[0] != a10Described || b[1] != a10SmallULong || b[2] != a10AppProps {
		return nil, fmt.Errorf("not an application-properties section")
	}
	b = b[3:]
	if len(b) < 1 {
		return nil, errTruncated
	}
	var count int
	switch b[0] {
	case a10Map8:
		if len(b) < 3 {
			return nil, errTruncated
		}
		count, b = int(b[2]), b[3:]
	case a10Map32:
		if len(b) < 9 {
			return nil, errTruncated
		}
		count, b = int(binary.BigEndian.Uint32(b[5:9])), b[9:]
	case a10Null:
		return map[string]string{}, nil
	default:
		return nil, fmt.Errorf("application-properties is of type 0x%02x, not a map", b[0])
	}
	if count%2 != 0 {
		return nil, fmt.Errorf("map of %d elements", count)
	}
	out := make(map[string]string, count/2)
	for i := 0; i < count; i += 2 {
		k, ok, rest, err := decodeValue(b)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("null key")
		}
		v, ok, rest, err := decodeValue(rest)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", k, err)
		}
		if ok {
			out[k] = v
		}
		b = rest
	}
	return out, nil
}

// decodeValue decodes one AMQP 1.0 primitive value as a string (ok false
// for null) and returns the bytes after it.
func decodeValue(b []byte) (s string, ok bool, rest []byte, err error) {
	if len(b) < 1 {
		return "", false, nil, errTruncated
	}
	code, b := b[0], b[1:]
	fixed := func(n int) ([]byte, error) {
		if len(b) < n {
			return nil, errTruncated
		}
		v := b[:n]
		b = b[n:]
		return v, nil
	}
	variable := func(lenBytes int) (string, error) {
		l, err := fixed(lenBytes)
		if err != nil {
			return "", err
		}
		n := int(l[0])
		if lenBytes == 4 {
			n = int(binary.BigEndian.Uint32(l))
		}
		v, err := fixed(n)
		return string(v), err
	}
	var v []byte
	switch code {
	case a10Null:
		return "", false, b, nil
	case a10True:
		return "true", true, b, nil
	case a10False:
		return "false", true, b, nil
	case a10UInt0, a10ULong0:
		return "0", true, b, nil
	case a10Bool:
		if v, err = fixed(1); err == nil {
			s = strconv.FormatBool(v[0] != 0)
		}
	case a10UByte, a10SmallUInt, a10SmallULong:
		if v, err = fixed(1); err == nil {
			s = strconv.FormatUint(uint64(v[0]), 10)
		}
	case a10Byte, a10SmallInt, a10SmallLong:
		if v, err = fixed(1); err == nil {
			s = strconv.FormatInt(int64(int8(v[0])), 10)
		}
	case a10UShort:
		if v, err = fixed(2); err == nil {
			s = strconv.FormatUint(uint64(binary.BigEndian.Uint16(v)), 10)
		}
	case a10Short:
		if v, err = fixed(2); err == nil {
			s = strconv.FormatInt(int64(int16(binary.BigEndian.Uint16(v))), 10)
		}
	case a10UInt:
		if v, err = fixed(4); err == nil {
			s = strconv.FormatUint(uint64(binary.BigEndian.Uint32(v)), 10)
		}
	case a10Int:
		if v, err = fixed(4); err == nil {
			s = strconv.FormatInt(int64(int32(binary.BigEndian.Uint32(v))), 10)
		}
	case a10ULong:
		if v, err = fixed(8); err == nil {
			s = strconv.FormatUint(binary.BigEndian.Uint64(v), 10)
		}
	case a10Long:
		if v, err = fixed(8); err == nil {
			s = strconv.FormatInt(int64(binary.BigEndian.Uint64(v)), 10)
		}
	case a10Timestamp:
		if v, err = fixed(8); err == nil {
			ms := int64(binary.BigEndian.Uint64(v))
			if ms > math.MaxInt64/int64(time.Millisecond) || ms < math.MinInt64/int64(time.Millisecond) {
				return "", false, nil, fmt.Errorf("timestamp %d out of range", ms)
			}
			s = time.UnixMilli(ms).UTC().Format(time.RFC3339Nano)
		}
	case a10Float:
		if v, err = fixed(4); err == nil {
			s = strconv.FormatFloat(float64(math.Float32frombits(binary.BigEndian.Uint32(v))), 'g', -1, 32)
		}
	case a10Double:
		if v, err = fixed(8); err == nil {
			s = strconv.FormatFloat(math.Float64frombits(binary.BigEndian.Uint64(v)), 'g', -1, 64)
		}
	case a10Char:
		if v, err = fixed(4); err == nil {
			s = string(rune(binary.BigEndian.Uint32(v)))
		}
	case a10UUID:
		if v, err = fixed(16); err == nil {
			s = fmt.Sprintf("%x-%x-%x-%x-%x", v[0:4], v[4:6], v[6:8], v[8:10], v[10:16])
		}
	case a10Str8, a10Sym8:
		s, err = variable(1)
	case a10Str32, a10Sym32:
		s, err = variable(4)
	case a10Vbin8, a10Vbin32:
		n := 1
		if code == a10Vbin32 {
			n = 4
		}
		if s, err = variable(n); err == nil {
			s = base64.StdEncoding.EncodeToString([]byte(s))
		}
	default:
		return "", false, nil, fmt.Errorf("unsupported AMQP 1.0 type 0x%02x", code)
	}
	if err != nil {
		return "", false, nil, err
	}
	return s, true, b, nil
}
