package charges_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/url"
	"testing"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/charges"
)

// TestReconcileDoesNotRecreateWhatItsMetadataDoNotDerive: reconciliation
// re-creates a lost record only when the PaymentIntent's metadata (account,
// key, fingerprint) derive the very idempay_record it carries (I13). A
// PaymentIntent whose metadata name an account and a key but another
// record (made outside idempay, or its metadata edited since) is flagged,
// and nothing is written into that account's ledger.
func TestReconcileDoesNotRecreateWhatItsMetadataDoNotDerive(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	fingerprint := sha256.Sum256([]byte("a request never made"))
	resp, err := http.PostForm(env.Stripe.URL()+"/v1/payment_intents", url.Values{"amount": {"990"},
		"currency": {"usd"}, "confirm": {"true"}, "payment_method": {"pm_card_visa"},
		"metadata[" + charges.MetadataRecord + "]":      {"idk_not_derived_from_the_rest"},
		"metadata[" + charges.MetadataAccount + "]":     {c.Account.ID},
		"metadata[" + charges.MetadataKey + "]":         {"forged-key"},
		"metadata[" + charges.MetadataFingerprint + "]": {hex.EncodeToString(fingerprint[:])}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("creating the PaymentIntent at the fake: %d", resp.StatusCode)
	}

	reconcilePass(t, env, map[string]int{charges.ReconcileUnknown: 1})
	var charged, records int
	if err := env.Pool.QueryRow(context.Background(), `SELECT count(*) FROM charges WHERE account_id = $1`, c.Account.ID).Scan(&charged); err != nil {
		t.Fatal(err)
	}
	if err := env.Pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE account_id = $1`, c.Account.ID).Scan(&records); err != nil {
		t.Fatal(err)
	}
	if charged != 0 || records != 0 {
		t.Errorf("after reconciling a PaymentIntent whose metadata do not derive its record: %d charges in the account, %d records in it; want none", charged, records)
	}
}
