package idempotency

import (
	"encoding/hex"
	"testing"
)

// Records stored under fingerprint version 1 stay comparable during the
// retention window after the upgrade: these are the fingerprints that the
// version-1 code computed for these requests.
func TestLegacyFingerprintUnchanged(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ body, want string }{
		{`{"amount": 2000, "currency":"usd","payment_method":"tok_visa","description":"T-shirt","metadata":{"b":"2","a":"1"}}`,
			"c296d0daf76924d9b964f516d188c6b92e6adbdcbd7bb9a583d2d30b96f1fe0d"},
		{`{"charge":"ch_1","amount":500}`, "018a2f75547e5c7279664142f46098e59ee5f1436e33f4f0fcee223df0ba4f50"},
	} {
		got := hex.EncodeToString(legacyFingerprint(Request{Method: "POST", Path: "/v1/charges", Body: []byte(tc.body)}))
		if got != tc.want {
			t.Errorf("version-1 fingerprint of %s = %s, want %s", tc.body, got, tc.want)
		}
	}
}
