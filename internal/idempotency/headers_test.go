package idempotency

import (
	"net/http"
	"reflect"
	"testing"
)

// The stored form of the replayed headers (what PostgreSQL returns for the
// jsonb that encodeHeaders wrote) decodes to the allow-listed headers only.
func TestDecodeHeadersStoredForm(t *testing.T) {
	in := http.Header{"Content-Type": {"application/json"}, "Location": {"/v1/charges/ch_1"},
		"Idempay-Charge-Id": {"ch_1"}, "Date": {"not replayed"}}
	stored, err := encodeHeaders(in)
	if err != nil {
		t.Fatal(err)
	}
	jsonb := []byte(`{"Location": "/v1/charges/ch_1", "Content-Type": "application/json", "Idempay-Charge-Id": "ch_1"}`)
	want := http.Header{"Content-Type": {"application/json"}, "Location": {"/v1/charges/ch_1"}, "Idempay-Charge-Id": {"ch_1"}}
	for _, b := range [][]byte{stored, jsonb} {
		got, err := decodeHeaders(b)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("decodeHeaders(%s) = %v, want %v", b, got, want)
		}
	}
	if got, err := decodeHeaders([]byte(`{"Date": "x", "Set-Cookie": "y"}`)); err != nil || len(got) != 0 {
		t.Errorf("decodeHeaders of headers never stored = %v, %v; want none", got, err)
	}
	for _, bad := range []string{`[]`, `{"Location": 1}`, `{`} {
		if _, err := decodeHeaders([]byte(bad)); err == nil {
			t.Errorf("decodeHeaders(%s) accepted a value that encodeHeaders never writes", bad)
		}
	}
}
