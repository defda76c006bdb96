package client

// ParseRetryAfter exposes the Retry-After parser to the external tests
// (FuzzRetryAfter) without making it part of the API.
var ParseRetryAfter = parseRetryAfter
