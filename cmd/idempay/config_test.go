package main

import (
	"strings"
	"testing"
	"time"
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

// TestRetryCeilingSetting: IDEMPOTENCY_RETRY_CEILING is 12 h by default
// and must stay under Stripe's 24 hours and above the lock timeout; a value
// outside is a configuration error that names the variable.
func TestRetryCeilingSetting(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  time.Duration
		err   bool
	}{{"", 12 * time.Hour, false}, {"6h", 6 * time.Hour, false}, {"23h", 23 * time.Hour, false},
		{"24h", 0, true}, {"48h", 0, true}, {"30s", 0, true}, {"soon", 0, true}} {
		t.Setenv("IDEMPOTENCY_RETRY_CEILING", tc.value)
		cfg, err := loadConfig()
		switch {
		case tc.err && (err == nil || !strings.Contains(err.Error(), "IDEMPOTENCY_RETRY_CEILING")):
			t.Errorf("IDEMPOTENCY_RETRY_CEILING=%q: error %v, want one naming the variable", tc.value, err)
		case !tc.err && err != nil:
			t.Errorf("IDEMPOTENCY_RETRY_CEILING=%q: %v", tc.value, err)
		case !tc.err && cfg.Idempotency.RetryCeiling != tc.want:
			t.Errorf("IDEMPOTENCY_RETRY_CEILING=%q: RetryCeiling %v, want %v", tc.value, cfg.Idempotency.RetryCeiling, tc.want)
		}
	}
}
