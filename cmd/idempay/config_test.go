package main

import (
	"strings"
	"testing"
	"time"
)

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
