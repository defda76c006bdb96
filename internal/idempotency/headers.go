package idempotency

import "github.com/go-json-experiment/json"

// Headers are the response headers a record stores and replays: an
// allow-list, so Date, Set-Cookie and per-request headers are never replayed
// (I2). The stored form is this struct's JSON; a struct rather than a map,
// and the library that decodes request bodies rather than encoding/json,
// because every replay decodes it (docs/benchmarks-history.md, "The replay tail").
type Headers struct {
	ContentType string `json:"Content-Type,omitempty"`
	Location    string `json:"Location,omitempty"`
}

// encodeHeaders is the stored form of a response's replayed headers.
func encodeHeaders(h Headers) ([]byte, error) { return json.Marshal(&h) }

// decodeHeaders reads what encodeHeaders stored (or, as a jsonb column
// returns it, spaced and reordered). Other names are ignored.
func decodeHeaders(b []byte) (Headers, error) {
	var h Headers
	err := json.Unmarshal(b, &h)
	return h, err
}
