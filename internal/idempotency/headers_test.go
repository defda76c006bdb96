package idempotency

import (
	"net/http"
	"reflect"
	"testing"
)

var headerSeeds = []string{
	`{"Location": "/v1/charges/ch_1", "Content-Type": "application/json", "Idempay-Charge-Id": "ch_1"}`,
	`{"Content-Type":"application/problem+json"}`,
	`{}`, ` { } `, `{"A": ""}`,
	`{"A": "1", "A": "2"}`,
	`{"A": "caf\u00e9"}`, `{"A": "café"}`, `{"A": "x\"y"}`, `{"A\\B": "x"}`,
	`{"A": 1}`, `{"A": null}`, `{"A": ["x"]}`, `[]`, `null`, `"x"`, ``, `{`, `{"A": "x",}`,
	`{"A": "x"} x`, `{"A" "x"}`, `{"A": "x" "B": "y"}`,
	`{"A":"1","B":"2","C":"3","D":"4","E":"5","F":"6","G":"7","H":"8","I":"9","J":"10"}`,
}

func FuzzDecodeHeaders(f *testing.F) {
	for _, s := range headerSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := decodeHeaders(b)
		want, wantErr := decodeHeadersJSON(b)
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("decodeHeaders(%q) error %v, reference error %v", b, err, wantErr)
		}
		if err == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("decodeHeaders(%q) = %v, reference %v", b, got, want)
		}
		if h, ok := decodeHeadersFast(b); ok && !reflect.DeepEqual(h, want) {
			t.Fatalf("fast path %q = %v, reference %v", b, h, want)
		}
	})
}

func TestDecodeHeadersStoredForm(t *testing.T) {
	// What PostgreSQL returns for the jsonb that encodeHeaders wrote.
	in := http.Header{"Content-Type": {"application/json"}, "Location": {"/v1/charges/ch_1"},
		"Idempay-Charge-Id": {"ch_1"}, "Date": {"not replayed"}}
	stored, err := encodeHeaders(in)
	if err != nil {
		t.Fatal(err)
	}
	jsonb := []byte(`{"Location": "/v1/charges/ch_1", "Content-Type": "application/json", "Idempay-Charge-Id": "ch_1"}`)
	if _, ok := decodeHeadersFast(jsonb); !ok {
		t.Fatalf("the fast path declined the stored form %s", jsonb)
	}
	for _, b := range [][]byte{stored, jsonb} {
		got, err := decodeHeaders(b)
		if err != nil {
			t.Fatal(err)
		}
		want := http.Header{"Content-Type": {"application/json"}, "Location": {"/v1/charges/ch_1"}, "Idempay-Charge-Id": {"ch_1"}}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("decodeHeaders(%s) = %v, want %v", b, got, want)
		}
	}
	allocs := testing.AllocsPerRun(100, func() { _, _ = decodeHeaders(jsonb) })
	if allocs > 4 { // the text, the map (2), the values
		t.Fatalf("decodeHeaders allocated %.0f times for the stored form; want at most 4", allocs)
	}
}
