package main

import (
	"strings"
	"testing"
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
