package charges

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

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

// decodeParams decodes the JSON object raw into dst and validates it.
//
// The decoding is strict, by github.com/go-json-experiment/json (the
// encoding/json/v2 design) with its defaults: a name given twice in one
// object and text that is not valid Unicode (bytes that are not UTF-8, an
// unpaired surrogate escape) are refused, where encoding/json would keep
// the last value or decode U+FFFD, and a proxy, a log or Stripe could read
// another request than the ledger holds. Names match the json tags exactly
// ("Amount" is not "amount"), and an unknown name is refused: a typo must
// not be silently ignored in a payment.
//
// Every refusal is a 400. A body that breaks the grammar is an
// invalid-json; one that gives a name twice or has invalid text is refused
// at its first such place, which invalid_params names. Otherwise every
// problem is reported at once, in one invalid-request: every unknown field
// and every field of the wrong type (in the order of the body), then every
// failed check of the other fields (dst.validate), so a client that sends
// a typo and a bad amount learns of both. A body that is not a JSON
// object is refused as such.
func decodeParams(raw []byte, dst params) error {
	// The usual body is a valid one: one decode, and the walk member by
	// member below only when that fails, to name every problem.
	if err := json.Unmarshal(raw, dst, json.RejectUnknownMembers(true)); err == nil {
		return dst.validate()
	}
	reflect.ValueOf(dst).Elem().SetZero() // what the failed decode left half done
	if err := checkForm(raw); err != nil {
		return err
	}
	dec := jsontext.NewDecoder(bytes.NewReader(raw))
	if dec.PeekKind() != jsontext.KindBeginObject {
		return apierror.New(apierror.InvalidRequest, "The request body must be a JSON object.")
	}
	if _, err := dec.ReadToken(); err != nil {
		return undecodable(err)
	}
	var bad []apierror.InvalidParam
	failed := map[string]bool{} // fields already named, not validated again
	for dec.PeekKind() != jsontext.KindEndObject {
		// Decode this member alone, so that a problem here does not hide
		// the others: {"name":value} into dst.
		name, err := dec.ReadValue()
		if err != nil {
			return undecodable(err)
		}
		member := append([]byte("{"), name...)
		value, err := dec.ReadValue()
		if err != nil {
			return undecodable(err)
		}
		member = append(append(append(member, ':'), value...), '}')
		err = json.Unmarshal(member, dst, json.RejectUnknownMembers(true))
		var se *json.SemanticError
		switch {
		case err == nil:
			continue
		case !errors.As(err, &se):
			return undecodable(err)
		case errors.Is(err, json.ErrUnknownName):
			bad = append(bad, apierror.InvalidParam{Name: paramName(se.JSONPointer), Reason: "is not a known parameter"})
		default:
			bad = append(bad, apierror.InvalidParam{Name: paramName(se.JSONPointer), Reason: wrongType(se)})
		}
		failed[baseField(paramName(se.JSONPointer))] = true
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

// checkForm refuses raw unless it is one JSON value in the form RFC 7493
// (I-JSON) asks: no name twice in an object, valid Unicode text. A body
// that is JSON but for that is an invalid-request naming the first place
// at fault; any other is an invalid-json.
func checkForm(raw []byte) error {
	err := json.Unmarshal(raw, new(jsontext.Value))
	var se *jsontext.SyntacticError
	switch {
	case err == nil:
		return nil
	case !errors.As(err, &se):
		return undecodable(err)
	case errors.Is(err, jsontext.ErrDuplicateName):
		return apierror.Invalid(apierror.InvalidParam{Name: paramName(se.JSONPointer), Reason: "is given more than once"})
	case jsontext.Value(raw).IsValid(jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true)):
		// JSON, but for its text: the error is about the value at the
		// pointer, or about a name of the object there.
		return apierror.Invalid(apierror.InvalidParam{Name: paramName(se.JSONPointer),
			Reason: "must be valid UTF-8 text, and so must its keys (it has bytes that are not UTF-8, or an unpaired surrogate escape)"})
	}
	return undecodable(err)
}

func undecodable(err error) error {
	return apierror.Newf(apierror.InvalidJSON, "The request body could not be decoded: %v.", err)
}

// paramName is the invalid_params name of the value at p: "amount",
// "metadata[order_id]", or "body" for the whole body.
func paramName(p jsontext.Pointer) string {
	name, first := "body", true
	for token := range p.Tokens() {
		if first {
			name, first = token, false
		} else {
			name += "[" + token + "]"
		}
	}
	return name
}

// baseField is the top-level field an invalid_params name is about
// ("metadata[k]" is about metadata).
func baseField(name string) string {
	if i := strings.IndexByte(name, '['); i >= 0 {
		return name[:i]
	}
	return name
}

// wrongType is the reason for a value that does not decode into its field.
func wrongType(e *json.SemanticError) string {
	want := "of another JSON type"
	if e.GoType != nil {
		switch e.GoType.Kind() {
		case reflect.Int64:
			want = fmt.Sprintf("an integer between 1 and %d", MaxAmount)
		case reflect.String:
			want = "a string"
		case reflect.Bool:
			want = "true or false"
		case reflect.Map:
			want = "an object of string values"
		}
	}
	switch e.JSONKind {
	case jsontext.KindNumber: // of the wrong form or out of range
		return "must be " + want
	case jsontext.KindString:
		return "must be " + want + ", not a JSON string"
	case jsontext.KindBeginObject:
		return "must be " + want + ", not a JSON object"
	case jsontext.KindBeginArray:
		return "must be " + want + ", not a JSON array"
	case jsontext.KindTrue, jsontext.KindFalse:
		return "must be " + want + ", not a JSON boolean"
	}
	return "must be " + want
}

// chargeParams is the body of POST /v1/charges.
type chargeParams struct {
	Amount        *int64            `json:"amount"`
	Currency      *string           `json:"currency"`
	PaymentMethod *string           `json:"payment_method"`
	Description   *string           `json:"description"`
	Metadata      map[string]string `json:"metadata"`
	// Capture false authorizes only: the charge waits in requires_capture
	// for POST /v1/charges/{id}/capture. true, the default, is normalised
	// away, so that a body with it and one without are the same request.
	Capture *bool `json:"capture"`
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
	Charge *string `json:"charge"`
	Amount *int64  `json:"amount"`
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
