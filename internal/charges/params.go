package charges

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/idempay/idempay/internal/jsonbody"
)

// Limits of the request format, documented in docs/api.md.
const (
	MaxAmount         = 99_999_999
	MaxDescription    = 1000
	MaxMetadataKeys   = 40
	MaxMetadataKey    = 40
	MaxMetadataValue  = 500
	MaxPaymentMethod  = 255
	maxChargeIDLength = 64
)

// currencies are the ISO 4217 codes the API accepts (lowercase, like Stripe).
var currencies = strings.Fields(`aed aud bgn brl cad chf clp cny czk dkk eur gbp hkd huf idr ils inr isk
	jpy krw mxn myr nok nzd php pln ron sek sgd thb try twd usd zar`)

var (
	paymentMethodPattern = regexp.MustCompile(`^[A-Za-z0-9_]+$`)
	chargeIDPattern      = regexp.MustCompile(`^ch_[a-z0-9]+$`)
)

// chargeParams is the body of POST /v1/charges.
type chargeParams struct {
	Amount        *int64            `json:"amount"`
	Currency      *string           `json:"currency"`
	PaymentMethod *string           `json:"payment_method"`
	Description   *string           `json:"description"`
	Metadata      map[string]string `json:"metadata"`
	// Capture false authorizes only (requires_capture, until a capture). true,
	// the default, is normalised away: a body with it and one without are one request.
	Capture *bool `json:"capture"`
}

func (p *chargeParams) Validate() error {
	var bad []InvalidParam
	add := func(name, reason string) { bad = append(bad, InvalidParam{Name: name, Reason: reason}) }

	bad = append(bad, validateAmount("amount", p.Amount, true)...)
	if p.Capture != nil && *p.Capture {
		p.Capture = nil
	}
	switch {
	case p.Currency == nil:
		add("currency", "is required")
	case !slices.Contains(currencies, strings.ToLower(*p.Currency)):
		add("currency", "must be a supported three-letter ISO 4217 code, such as usd or eur")
	default:
		lower := strings.ToLower(*p.Currency)
		p.Currency = &lower
	}
	switch {
	case p.PaymentMethod == nil || *p.PaymentMethod == "":
		add("payment_method", "is required (for example pm_card_visa)")
	case len(*p.PaymentMethod) > MaxPaymentMethod || !paymentMethodPattern.MatchString(*p.PaymentMethod):
		add("payment_method", fmt.Sprintf("must be 1 to %d letters, digits or underscores", MaxPaymentMethod))
	}
	if p.Description != nil {
		if reason := checkText(*p.Description, MaxDescription); reason != "" {
			add("description", reason)
		}
	}
	if len(p.Metadata) > MaxMetadataKeys {
		add("metadata", fmt.Sprintf("may have at most %d keys", MaxMetadataKeys))
	}
	for _, k := range slices.Sorted(maps.Keys(p.Metadata)) {
		// Stripe refuses square brackets in metadata keys: they would
		// break its form encoding (metadata[key]=value).
		// A key is a name: not even the line break and tab a value may hold.
		if reason := checkText(k, MaxMetadataKey); reason != "" || k == "" || strings.ContainsAny(k, "[]\n\t") {
			add("metadata", fmt.Sprintf("keys must be 1 to %d characters without control characters or square brackets", MaxMetadataKey))
			break
		}
		// idempay's own metadata at Stripe (requestMetadata) would overwrite
		// the client's key, and reconciliation drop it from a re-created charge.
		if strings.HasPrefix(k, MetadataPrefix) {
			add("metadata["+k+"]", "is reserved: keys starting with "+MetadataPrefix+" are idempay's own metadata at Stripe")
		}
		if reason := checkText(p.Metadata[k], MaxMetadataValue); reason != "" {
			add("metadata["+k+"]", reason)
		}
	}
	if len(bad) > 0 {
		return jsonbody.Invalid(bad...)
	}
	return nil
}

func validateAmount(name string, amount *int64, required bool) []InvalidParam {
	switch {
	case amount == nil && required:
		return []InvalidParam{{Name: name, Reason: "is required, in the currency's minor unit (cents)"}}
	case amount != nil && (*amount < 1 || *amount > MaxAmount):
		return []InvalidParam{{Name: name, Reason: fmt.Sprintf("must be an integer between 1 and %d", MaxAmount)}}
	}
	return nil
}

// checkText rejects what PostgreSQL text cannot hold (NUL) and what no one
// means to send (control characters), and enforces a length in characters.
func checkText(s string, max int) string {
	if utf8.RuneCountInString(s) > max {
		return fmt.Sprintf("must be at most %d characters", max)
	}
	for _, r := range s {
		if r < 0x20 && r != '\n' && r != '\t' || r == 0x7f {
			return "must not contain control characters"
		}
	}
	return ""
}
