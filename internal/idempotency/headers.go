package idempotency

import (
	"fmt"

	"github.com/go-json-experiment/json"
)

// Headers are the response headers a record stores and replays: an
// allow-list, so Date, Set-Cookie and per-request headers (X-Request-Id) are
// never replayed (I2). The core's own type, so that it speaks no HTTP: the
// HTTP adapter (package idemhttp) writes them onto a response.
//
// The stored form is the JSON of this struct (a json column, returned as
// written); a struct rather than a map, because every replay decodes it and
// a struct costs the values' allocations only (BENCHMARKS.md, "The replay
// tail"). It is encoded and decoded with the library that decodes request
// bodies, a sixth of encoding/json's CPU for this decode.
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

// decodeHeaders reads what encodeHeaders stored (or the same object spaced
// and in another order: {"Location": "/v1/charges/ch_1", "Content-Type":
// ...}, as a jsonb column returned it). Other names are ignored: they were
// never stored.
func decodeHeaders(b []byte) (Headers, error) {
	var h Headers
	err := json.Unmarshal(b, &h)
	return h, err
}
