package idempotency

import (
	"testing"

	jsonv2 "github.com/go-json-experiment/json"
)

// The stored form of the replayed headers (what the finish wrote, or the
// same object spaced and reordered) decodes to the allow-listed headers
// only.
func TestDecodeHeadersStoredForm(t *testing.T) {
	decodeHeaders := func(b []byte) (h Headers, err error) { err = jsonv2.Unmarshal(b, &h); return }
	in := Headers{ContentType: "application/json", Location: "/v1/charges/ch_1"}
	stored, err := jsonv2.Marshal(&in)
	if err != nil {
		t.Fatal(err)
	}
	jsonb := []byte(`{"Location": "/v1/charges/ch_1", "Content-Type": "application/json", "Date": "not replayed"}`)
	for _, b := range [][]byte{stored, jsonb} {
		got, err := decodeHeaders(b)
		if err != nil {
			t.Fatal(err)
		}
		if got != in {
			t.Fatalf("decodeHeaders(%s): Content-Type %q, Location %q; want %q, %q",
				b, got.ContentType, got.Location, in.ContentType, in.Location)
		}
	}
	if got, err := decodeHeaders([]byte(`{"Date": "x", "Set-Cookie": "y"}`)); err != nil || got != (Headers{}) {
		t.Errorf("decodeHeaders of headers never stored: Content-Type %q, Location %q, err %v; want none",
			got.ContentType, got.Location, err)
	}
	for _, bad := range []string{`[]`, `{"Location": 1}`, `{`} {
		if _, err := decodeHeaders([]byte(bad)); err == nil {
			t.Errorf("decodeHeaders(%s) accepted a value that the finish never writes", bad)
		}
	}
}
