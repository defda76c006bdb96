package idempotency

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// replayedHeaders are the only response headers stored and replayed. Date,
// Set-Cookie and per-request headers (X-Request-Id) are never replayed.
var replayedHeaders = []string{"Content-Type", "Location", "Idempay-Charge-Id", "Idempay-Refund-Id"}

// encodeHeaders is the stored form of a response's replayed headers: a JSON
// object of name to value (a jsonb column).
func encodeHeaders(h http.Header) ([]byte, error) {
	m := map[string]string{}
	for _, name := range replayedHeaders {
		if v := h.Get(name); v != "" {
			m[name] = v
		}
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encoding response headers: %w", err)
	}
	return b, nil
}

// decodeHeaders reads what encodeHeaders stored (as PostgreSQL returns the
// jsonb: {"Location": "/v1/charges/ch_1", "Content-Type": ...}). The names
// were written from an http.Header, so they are canonical already.
func decodeHeaders(b []byte) (http.Header, error) {
	var m map[string]string
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	h := make(http.Header, len(m))
	for k, v := range m {
		h[k] = []string{v}
	}
	return h, nil
}
