package charges

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/idempay/idempay/internal/apierror"
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
var currencies = map[string]bool{}

func init() {
	for _, c := range strings.Fields(`aed aud bgn brl cad chf clp cny czk dkk eur gbp hkd huf idr ils inr isk
		jpy krw mxn myr nok nzd php pln ron sek sgd thb try twd usd zar`) {
		currencies[c] = true
	}
}

var (
	paymentMethodPattern = regexp.MustCompile(`^[A-Za-z0-9_]+$`)
	chargeIDPattern      = regexp.MustCompile(`^ch_[a-z0-9]+$`)
)

// params is a request body type: a struct whose json tags name its fields,
// with its own validation of their values.
type params interface{ validate() error }

// decodeParams decodes the JSON object raw into dst and validates it. It
// reports every problem at once, in one 400 invalid-request whose
// invalid_params name each field: every field given twice (repeatedNames),
// every field whose name or text is not valid Unicode (InvalidText),
// every unknown field (in the order of the body), every known field of the
// wrong type, and every failed check of the known fields (dst.validate).
// So a client that sends a typo and a bad amount learns of both. A body
// that is not a JSON object is refused as such. Field names match the json
// tags as encoding/json matches them (case-insensitively).
func decodeParams(raw []byte, dst params) error {
	repeated := repeatedNames(raw)
	badText := InvalidText(raw)
	// The usual body is a valid one: one strict decode, and the walk field
	// by field below only when that fails, to name every problem at once.
	strict := json.NewDecoder(bytes.NewReader(raw))
	strict.DisallowUnknownFields()
	if err := strict.Decode(dst); err == nil && len(repeated) == 0 && len(badText) == 0 {
		return dst.validate()
	}
	reflect.ValueOf(dst).Elem().SetZero() // what the strict decode left half done
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil {
		return apierror.Newf(apierror.InvalidJSON, "The request body could not be decoded: %v.", err)
	} else if d, ok := tok.(json.Delim); !ok || d != '{' {
		return apierror.New(apierror.InvalidRequest, "The request body must be a JSON object.")
	}
	known := jsonFields(dst)
	var bad []apierror.InvalidParam
	failed := map[string]bool{} // fields already named, not validated again
	for i, name := range repeated {
		if !slices.Contains(repeated[:i], name) {
			bad = append(bad, apierror.InvalidParam{Name: name, Reason: "is given more than once"})
		}
		if field, ok := knownField(known, name); ok {
			failed[field] = true // which value counts is not for us to say
		}
	}
	// Text that is not valid Unicode: encoding/json would decode it as
	// U+FFFD, and the field's own checks would pass what was not sent.
	for _, p := range badText {
		if field := baseField(p.Name); !failed[field] {
			bad = append(bad, p)
			failed[field] = true
		}
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return apierror.Newf(apierror.InvalidJSON, "The request body could not be decoded: %v.", err)
		}
		name, _ := tok.(string)
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return apierror.Newf(apierror.InvalidJSON, "The request body could not be decoded: %v.", err)
		}
		field, ok := knownField(known, name)
		if !ok {
			if !failed[name] {
				bad = append(bad, apierror.InvalidParam{Name: name, Reason: "is not a known parameter"})
				failed[name] = true
			}
			continue
		}
		// Decode this field alone, so that a wrong type here does not hide
		// the other fields; the error names the field (or the member of it).
		one, err := json.Marshal(map[string]json.RawMessage{name: value})
		if err != nil {
			return apierror.Newf(apierror.InvalidJSON, "The request body could not be decoded: %v.", err)
		}
		if err := json.Unmarshal(one, dst); err != nil {
			var typeErr *json.UnmarshalTypeError
			if !errors.As(err, &typeErr) {
				return apierror.Newf(apierror.InvalidJSON, "The request body could not be decoded: %v.", err)
			}
			param := typeErr.Field
			if param == "" {
				param = field
			}
			if !failed[field] {
				bad = append(bad, apierror.InvalidParam{Name: param,
					Reason: fmt.Sprintf("must be %s, not a JSON %s", expected(typeErr), typeErr.Value)})
				failed[field] = true
			}
		}
	}
	if err := dst.validate(); err != nil {
		var pe *apierror.Error
		if !errors.As(err, &pe) || pe.Type != apierror.InvalidRequest {
			return err
		}
		for _, p := range pe.InvalidParams {
			if !failed[baseField(p.Name)] { // already named for its type
				bad = append(bad, p)
			}
		}
	}
	if len(bad) > 0 {
		return apierror.Invalid(bad...)
	}
	return nil
}

// jsonFields lists the json names of the fields of the struct dst points to.
func jsonFields(dst any) []string {
	t := reflect.TypeOf(dst).Elem()
	names := make([]string, 0, t.NumField())
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			names = append(names, name)
		}
	}
	return names
}

// knownField is the field that the body member name decodes into, as
// encoding/json matches it: exactly, or else case-insensitively.
func knownField(fields []string, name string) (string, bool) {
	for _, f := range fields {
		if f == name {
			return f, true
		}
	}
	for _, f := range fields {
		if strings.EqualFold(f, name) {
			return f, true
		}
	}
	return "", false
}

// baseField is the top-level field an invalid_params name is about
// ("metadata[k]" and "metadata.k" are about metadata).
func baseField(name string) string {
	if i := strings.IndexAny(name, "[."); i >= 0 {
		return name[:i]
	}
	return name
}

func expected(e *json.UnmarshalTypeError) string {
	switch e.Type.Kind().String() {
	case "int64", "int", "int32":
		return fmt.Sprintf("an integer between 1 and %d", MaxAmount)
	case "string":
		return "a string"
	case "map":
		return "an object of string values"
	default:
		return "of type " + e.Type.String()
	}
}

// chargeParams is the body of POST /v1/charges. Its fields are in the
// order of their json names, as in every params type: encoded, a
// normalised request is then in RFC 8785 form already and its fingerprint
// needs no canonicalisation (idempotency.Request.Normalize;
// TestParamsInNameOrder).
type chargeParams struct {
	Amount *int64 `json:"amount"`
	// Capture false authorizes only: the charge waits in requires_capture
	// for POST /v1/charges/{id}/capture. true, the default, is normalised
	// away, so that a body with it and one without are the same request.
	Capture       *bool             `json:"capture"`
	Currency      *string           `json:"currency"`
	Description   *string           `json:"description"`
	Metadata      map[string]string `json:"metadata"`
	PaymentMethod *string           `json:"payment_method"`
}

func (p *chargeParams) validate() error {
	var bad []apierror.InvalidParam
	add := func(name, reason string) { bad = append(bad, apierror.InvalidParam{Name: name, Reason: reason}) }

	bad = append(bad, validateAmount("amount", p.Amount, true)...)
	if p.Capture != nil && *p.Capture {
		p.Capture = nil
	}
	switch {
	case p.Currency == nil:
		add("currency", "is required")
	case !currencies[strings.ToLower(*p.Currency)]:
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
	var reserved []string
	for k, v := range p.Metadata {
		// Stripe refuses square brackets in metadata keys: they would
		// break its form encoding (metadata[key]=value).
		if reason := checkText(k, MaxMetadataKey); reason != "" || k == "" || strings.ContainsAny(k, "[]") {
			add("metadata", fmt.Sprintf("keys must be 1 to %d characters without control characters or square brackets", MaxMetadataKey))
			break
		}
		if strings.HasPrefix(k, MetadataPrefix) {
			reserved = append(reserved, k)
		}
		if reason := checkText(v, MaxMetadataValue); reason != "" {
			add("metadata["+k+"]", reason)
		}
	}
	// idempay's own metadata at Stripe (idempay_record and the request's
	// identity) would overwrite the client's key of the same name, and
	// reconciliation would drop it from a re-created charge: refused, so
	// that what the client sent is what Stripe and the ledger hold.
	slices.Sort(reserved)
	for _, k := range reserved {
		add("metadata["+k+"]", "is reserved: keys starting with "+MetadataPrefix+" are idempay's own metadata at Stripe")
	}
	if len(bad) > 0 {
		return apierror.Invalid(bad...)
	}
	return nil
}

func validateAmount(name string, amount *int64, required bool) []apierror.InvalidParam {
	switch {
	case amount == nil && required:
		return []apierror.InvalidParam{{Name: name, Reason: "is required, in the currency's minor unit (cents)"}}
	case amount != nil && (*amount < 1 || *amount > MaxAmount):
		return []apierror.InvalidParam{{Name: name, Reason: fmt.Sprintf("must be an integer between 1 and %d", MaxAmount)}}
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

// refundParams is the body of POST /v1/refunds. Amount is required:
// everything sent to Stripe comes from the request (I13), and a refund
// without an amount would have Stripe decide it from what Stripe holds at
// the time of the call, which a retry after a restore or a failover can
// find different (docs/development.md, "Refunds name their amount").
type refundParams struct {
	Amount *int64  `json:"amount"`
	Charge *string `json:"charge"`
}

func (p *refundParams) validate() error {
	var bad []apierror.InvalidParam
	switch {
	case p.Charge == nil || *p.Charge == "":
		bad = append(bad, apierror.InvalidParam{Name: "charge", Reason: "is required"})
	case len(*p.Charge) > maxChargeIDLength || !chargeIDPattern.MatchString(*p.Charge):
		bad = append(bad, apierror.InvalidParam{Name: "charge", Reason: "must be a charge id (ch_...)"})
	}
	if p.Amount == nil {
		bad = append(bad, apierror.InvalidParam{Name: "amount",
			Reason: "is required: the amount to refund, in the currency's minor unit (the charge's amount_captured less its amount_refunded is what is left)"})
	}
	bad = append(bad, validateAmount("amount", p.Amount, false)...)
	if len(bad) > 0 {
		return apierror.Invalid(bad...)
	}
	return nil
}

// captureParams is the body of POST /v1/charges/{id}/capture.
type captureParams struct {
	// Amount is what to capture, at most what is capturable; nil captures
	// all of it. The rest of the authorization is released.
	Amount *int64 `json:"amount"`
}

func (p *captureParams) validate() error {
	if bad := validateAmount("amount", p.Amount, false); len(bad) > 0 {
		return apierror.Invalid(bad...)
	}
	return nil
}

// cancelParams is the body of POST /v1/charges/{id}/cancel: nothing.
type cancelParams struct{}

func (p *cancelParams) validate() error { return nil }
