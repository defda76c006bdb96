package idempotency

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// storedHeaders are the only response headers stored and replayed, in
// their stored form: a JSON object of name to value (a jsonb column). Date,
// Set-Cookie and per-request headers (X-Request-Id) are never replayed.
//
// A struct rather than a map, because a replay decodes it: into a struct,
// encoding/json allocates for the values only (BENCHMARKS.md, "The replay
// tail").
type storedHeaders struct {
	ContentType string `json:"Content-Type,omitempty"`
	Location    string `json:"Location,omitempty"`
	ChargeID    string `json:"Idempay-Charge-Id,omitempty"`
	RefundID    string `json:"Idempay-Refund-Id,omitempty"`
}

// headerField is one stored header: its name and where its value is.
type headerField struct {
	name  string
	value *string
}

func (s *storedHeaders) fields() [4]headerField {
	return [4]headerField{
		{"Content-Type", &s.ContentType}, {"Location", &s.Location},
		{"Idempay-Charge-Id", &s.ChargeID}, {"Idempay-Refund-Id", &s.RefundID},
	}
}

// encodeHeaders is the stored form of a response's replayed headers.
func encodeHeaders(h http.Header) ([]byte, error) {
	var s storedHeaders
	for _, f := range s.fields() {
		*f.value = h.Get(f.name)
	}
	b, err := json.Marshal(&s)
	if err != nil {
		return nil, fmt.Errorf("encoding response headers: %w", err)
	}
	return b, nil
}

// decodeHeaders reads what encodeHeaders stored (as PostgreSQL returns the
// jsonb: {"Location": "/v1/charges/ch_1", "Content-Type": ...}). Other
// names are ignored: they were never stored.
func decodeHeaders(b []byte) (http.Header, error) {
	var s storedHeaders
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, err
	}
	fields := s.fields()
	h := make(http.Header, len(fields))
	values := make([]string, 0, len(fields)) // one array for every value
	for _, f := range fields {
		if *f.value != "" {
			values = append(values, *f.value)
			h[f.name] = values[len(values)-1 : len(values) : len(values)]
		}
	}
	return h, nil
}
