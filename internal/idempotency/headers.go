package idempotency

import (
	"encoding/json"
	"fmt"
)

// Headers are the response headers a record stores and replays: an
// allow-list, so Date, Set-Cookie and per-request headers (X-Request-Id) are
// never replayed (I2). The core's own type, so that it speaks no HTTP: the
// HTTP adapter (package idemhttp) writes them onto a response.
//
// The stored form is the JSON of this struct (a jsonb column); a struct
// rather than a map, because a replay decodes it and encoding/json then
// allocates for the values only (BENCHMARKS.md, "The replay tail").
type Headers struct {
	ContentType string `json:"Content-Type,omitempty"`
	Location    string `json:"Location,omitempty"`
}

// encodeHeaders is the stored form of a response's replayed headers.
func encodeHeaders(h Headers) ([]byte, error) {
	b, err := json.Marshal(&h)
	if err != nil {
		return nil, fmt.Errorf("encoding response headers: %w", err)
	}
	return b, nil
}

// decodeHeaders reads what encodeHeaders stored (as PostgreSQL returns the
// jsonb: {"Location": "/v1/charges/ch_1", "Content-Type": ...}). Other
// names are ignored: they were never stored.
func decodeHeaders(b []byte) (Headers, error) {
	var h Headers
	err := json.Unmarshal(b, &h)
	return h, err
}
