package main

import (
	"strings"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/server"
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

// TestRetentionSetting: IDEMPOTENCY_RETENTION is 24 h by default; zero or
// a negative window, or a negative grace, is a configuration error naming
// the variables.
func TestRetentionSetting(t *testing.T) {
	for _, tc := range []struct {
		retention, grace string
		err              bool
	}{{"", "", false}, {"1h", "0s", false}, {"0s", "", true}, {"-1h", "", true}, {"", "-1s", true}} {
		t.Setenv("IDEMPOTENCY_RETENTION", tc.retention)
		t.Setenv("IDEMPOTENCY_RETENTION_GRACE", tc.grace)
		cfg, err := loadConfig()
		switch {
		case tc.err && (err == nil || !strings.Contains(err.Error(), "IDEMPOTENCY_RETENTION")):
			t.Errorf("IDEMPOTENCY_RETENTION=%q, _GRACE=%q: error %v, want one naming the variables", tc.retention, tc.grace, err)
		case !tc.err && err != nil:
			t.Errorf("IDEMPOTENCY_RETENTION=%q, _GRACE=%q: %v", tc.retention, tc.grace, err)
		case tc.retention == "" && !tc.err && cfg.Idempotency.Retention != 24*time.Hour:
			t.Errorf("default IDEMPOTENCY_RETENTION: %v, want 24h", cfg.Idempotency.Retention)
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

// TestRowLockWaitSetting: IDEMPOTENCY_ROW_LOCK_WAIT is 5 s by default and 0
// waits without bound. PostgreSQL's lock_timeout counts whole milliseconds
// up to 2147483647: a positive wait under a millisecond would be sent as
// 0ms, no bound at all, and a longer one than its maximum fails every
// claim that sets it (a refund's, an endpoint's), so both are configuration
// errors naming the variable, as are a negative and a non-duration.
func TestRowLockWaitSetting(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  time.Duration
		err   bool
	}{{"", 5 * time.Second, false}, {"0", 0, false}, {"1ms", time.Millisecond, false}, {"250ms", 250 * time.Millisecond, false},
		{"596h", 596 * time.Hour, false}, {"2147483647ms", 2147483647 * time.Millisecond, false},
		{"1ns", 0, true}, {"999us", 0, true}, {"2147483648ms", 0, true}, {"1000h", 0, true},
		{"-1s", 0, true}, {"abc", 0, true}} {
		t.Setenv("IDEMPOTENCY_ROW_LOCK_WAIT", tc.value)
		cfg, err := loadConfig()
		switch {
		case tc.err && (err == nil || !strings.Contains(err.Error(), "IDEMPOTENCY_ROW_LOCK_WAIT")):
			t.Errorf("IDEMPOTENCY_ROW_LOCK_WAIT=%q: error %v, want one naming the variable", tc.value, err)
		case !tc.err && err != nil:
			t.Errorf("IDEMPOTENCY_ROW_LOCK_WAIT=%q: %v", tc.value, err)
		case !tc.err && cfg.Idempotency.RowLockWait != tc.want:
			t.Errorf("IDEMPOTENCY_ROW_LOCK_WAIT=%q: RowLockWait %v, want %v", tc.value, cfg.Idempotency.RowLockWait, tc.want)
		}
	}
}
