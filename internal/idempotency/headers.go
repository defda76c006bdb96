package idempotency

// Headers are the response headers a record stores and replays: an
// allow-list, so Date, Set-Cookie and per-request headers are never replayed
// (I2). The stored form is this struct's JSON; a struct rather than a map,
// and the library that decodes request bodies (jsonv2) rather than encoding/json,
// because every replay decodes it (docs/benchmarks-history.md, "The replay tail").
type Headers struct {
	ContentType string `json:"Content-Type,omitempty"`
	Location    string `json:"Location,omitempty"`
}
