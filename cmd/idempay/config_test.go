package main

import (
	"strings"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/server"
)

// TestAsyncClaimSetting: IDEMPOTENCY_ASYNC_CLAIM is on by default, off with
// off (or false, 0, no), and anything else is a configuration error that
// names the variable.
func TestAsyncClaimSetting(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  bool
		err   bool
	}{{"", true, false}, {"on", true, false}, {"TRUE", true, false}, {"off", false, false}, {"0", false, false}, {"no", false, false}, {"maybe", true, true}} {
		t.Setenv("IDEMPOTENCY_ASYNC_CLAIM", tc.value)
		cfg, err := loadConfig()
		switch {
		case tc.err && (err == nil || !strings.Contains(err.Error(), "IDEMPOTENCY_ASYNC_CLAIM")):
			t.Errorf("IDEMPOTENCY_ASYNC_CLAIM=%q: error %v, want one naming the variable", tc.value, err)
		case !tc.err && err != nil:
			t.Errorf("IDEMPOTENCY_ASYNC_CLAIM=%q: %v", tc.value, err)
		case !tc.err && cfg.Idempotency.AsyncClaim != tc.want:
			t.Errorf("IDEMPOTENCY_ASYNC_CLAIM=%q: AsyncClaim %v, want %v", tc.value, cfg.Idempotency.AsyncClaim, tc.want)
		}
	}
}

// TestHTTPWriteTimeoutSetting: HTTP_WRITE_TIMEOUT defaults to the server's
// own, and one that a request calling Stripe could outlast (the read
// timeout plus STRIPE_TIMEOUT) is a configuration error naming it.
func TestHTTPWriteTimeoutSetting(t *testing.T) {
	for _, tc := range []struct {
		write, stripe string
		want          time.Duration
		err           bool
	}{{"", "", server.DefaultWriteTimeout, false}, {"90s", "20s", 90 * time.Second, false}, {"45s", "20s", 0, true}, {"40s", "10s", 0, true}} {
		t.Setenv("HTTP_WRITE_TIMEOUT", tc.write)
		t.Setenv("STRIPE_TIMEOUT", tc.stripe)
		cfg, err := loadConfig()
		switch {
		case tc.err && (err == nil || !strings.Contains(err.Error(), "HTTP_WRITE_TIMEOUT")):
			t.Errorf("HTTP_WRITE_TIMEOUT=%q STRIPE_TIMEOUT=%q: error %v, want one naming HTTP_WRITE_TIMEOUT", tc.write, tc.stripe, err)
		case !tc.err && err != nil:
			t.Errorf("HTTP_WRITE_TIMEOUT=%q STRIPE_TIMEOUT=%q: %v", tc.write, tc.stripe, err)
		case !tc.err && cfg.HTTPWriteTimeout != tc.want:
			t.Errorf("HTTP_WRITE_TIMEOUT=%q: %s, want %s", tc.write, cfg.HTTPWriteTimeout, tc.want)
		}
	}
}
