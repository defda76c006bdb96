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
//
// It is on every replay, so it reads the usual object itself, in four
// allocations (the text, the map, the values; encoding/json takes 18);
// anything unusual (escapes,
// non-ASCII, a duplicate name, not a flat object of strings) goes to
// encoding/json, which defines the result.
func decodeHeaders(b []byte) (http.Header, error) {
	if h, ok := decodeHeadersFast(b); ok {
		return h, nil
	}
	return decodeHeadersJSON(b)
}

// decodeHeadersJSON is the fallback and the definition of decodeHeaders.
func decodeHeadersJSON(b []byte) (http.Header, error) {
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

// decodeHeadersFast parses a flat JSON object whose keys and values are
// strings without escapes, of bytes 0x20 to 0x7f (the strings
// canonicalizeFast handles). ok is false for anything else.
func decodeHeadersFast(b []byte) (h http.Header, ok bool) {
	s := string(b)         // one copy; names and values are substrings of it
	var small [8][2]string // name, value: on the stack for up to 8 headers
	pairs := small[:0]
	i := skipSpace(b, 0)
	if i >= len(s) || s[i] != '{' {
		return nil, false
	}
	i = skipSpace(b, i+1)
	if i < len(s) && s[i] == '}' {
		i++
	} else {
		for {
			k, next, ok := headerString(b, s, i)
			if !ok {
				return nil, false
			}
			i = skipSpace(b, next)
			if i >= len(s) || s[i] != ':' {
				return nil, false
			}
			v, next, ok := headerString(b, s, skipSpace(b, i+1))
			if !ok {
				return nil, false
			}
			pairs = append(pairs, [2]string{k, v})
			if i = skipSpace(b, next); i >= len(s) {
				return nil, false
			}
			if s[i] == ',' {
				i = skipSpace(b, i+1)
				continue
			}
			if s[i] != '}' {
				return nil, false
			}
			i++
			break
		}
	}
	if skipSpace(b, i) != len(s) {
		return nil, false
	}
	h = make(http.Header, len(pairs))
	vals := make([]string, len(pairs))
	for n, p := range pairs {
		if _, dup := h[p[0]]; dup {
			return nil, false // encoding/json keeps the last; leave it to it
		}
		vals[n] = p[1]
		h[p[0]] = vals[n : n+1 : n+1]
	}
	return h, true
}

// headerString reads the JSON string at b[i] (s is b as a string) with the
// canonicaliser's scanString, so it declines the same strings: escapes,
// control and non-ASCII bytes. It returns the contents, a substring of s,
// and the index past the closing quote.
func headerString(b []byte, s string, i int) (string, int, bool) {
	if i >= len(b) || b[i] != '"' {
		return "", 0, false
	}
	end := scanString(b, i)
	if end < 0 {
		return "", 0, false
	}
	return s[i+1 : end-1], end, true
}
