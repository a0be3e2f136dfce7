package ledger

import (
	"encoding/json"
	"strings"
	"testing"
)

// FuzzDecodePayload feeds the ledger's payload decoder arbitrary bytes: it
// never panics, and a payload it accepts has every required field present,
// non-null and non-empty, and decodes to the same value the standard decoder
// gives.
func FuzzDecodePayload(f *testing.F) {
	f.Add([]byte(`{"order_id":"o-1","amount_cents":100,"currency":"EUR"}`))
	f.Add([]byte(`{"order_id":"o-1","customer_id":"c","amount_cents":100,"currency":"EUR"}`))
	f.Add([]byte(`{"order_id":"","amount_cents":1,"currency":"EUR"}`))
	f.Add([]byte(`{"order_id":null,"amount_cents":1e400,"currency":"EUR"}`))
	f.Add([]byte(`{"order_id":"o","amount_cents":"lots","currency":"EUR"}`))
	f.Add([]byte(`{"order_id":"o\u0000'; DROP TABLE ledger_entries; --","amount_cents":9223372036854775807,"currency":"\ud800"}`))
	f.Add([]byte(strings.Repeat(`{"a":`, 20000) + `1` + strings.Repeat(`}`, 20000)))
	f.Add([]byte(strings.Repeat(`[`, 100000)))
	f.Add([]byte{'{', 0xff, 0xfe, '}'})
	f.Add([]byte(nil))
	f.Fuzz(func(t *testing.T, payload []byte) {
		var paid OrderPaid
		if err := decode(payload, &paid, "order_id", "amount_cents", "currency"); err == nil {
			var fields map[string]json.RawMessage
			if json.Unmarshal(payload, &fields) != nil {
				t.Fatalf("accepted a payload that is not a JSON object: %q", payload)
			}
			for _, name := range []string{"order_id", "amount_cents", "currency"} {
				if raw, ok := fields[name]; !ok || string(raw) == "null" || string(raw) == `""` {
					t.Fatalf("accepted a payload without %s: %q", name, payload)
				}
			}
			var want OrderPaid
			if err := json.Unmarshal(payload, &want); err != nil || want != paid {
				t.Fatalf("decoded %+v, the standard decoder gives %+v (%v)", paid, want, err)
			}
		} else if err.Error() == "" {
			t.Fatal("an error without a message")
		}
		var created OrderCreated
		_ = decode(payload, &created, "order_id", "customer_id", "amount_cents", "currency")
	})
}
