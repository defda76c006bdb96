package stripeapi

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/charges"
)

// stripeBody answers with status and body as Stripe does: JSON, with a
// Request-Id.
func stripeBody(status int, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Request-Id", "req_answers")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}
}

// TestClassifyStripeAnswers sends a PaymentIntent through the Stripe port
// (stripe-go, over HTTP) to a server that answers as Stripe does, once per
// answer the contract names (step 8): Stripe's error bodies as it sends
// them, a proxy's page, a real timeout, a real connection reset and a
// refused connection. Each must be classified as the contract says, and
// every row of stripeAnswers must be reached by one of them.
func TestClassifyStripeAnswers(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	reached := make([]bool, len(stripeAnswers))
	t.Cleanup(func() { // after every subtest
		for i, ok := range reached {
			if !ok {
				t.Errorf("no answer reached row %d of stripeAnswers: %+v", i, stripeAnswers[i])
			}
		}
	})
	for _, tc := range []struct {
		name string
		// status is the answer's HTTP status, 0 when no Stripe error is
		// expected (stripe-go returns another error).
		status  int
		handler http.HandlerFunc
		want    charges.Outcome
	}{
		{"402 card_declined", 402, stripeBody(402, `{
  "error": {
    "charge": "ch_3PaQqg2eZvKYlo2C0mQbz1xA",
    "code": "card_declined",
    "decline_code": "generic_decline",
    "doc_url": "https://stripe.com/docs/error-codes/card-declined",
    "message": "Your card was declined.",
    "payment_intent": {
      "id": "pi_3PaQqg2eZvKYlo2C0kK3mU6s",
      "object": "payment_intent",
      "amount": 1000,
      "currency": "usd",
      "status": "requires_payment_method"
    },
    "request_log_url": "https://dashboard.stripe.com/test/logs/req_xY7mQ2bC9dK4pL?t=1718000000",
    "type": "card_error"
  }
}`), charges.OutcomeDeclined},
		{"402 insufficient_funds", 402, stripeBody(402, `{
  "error": {
    "charge": "ch_3PaQrT2eZvKYlo2C1pV7nQ0e",
    "code": "card_declined",
    "decline_code": "insufficient_funds",
    "doc_url": "https://stripe.com/docs/error-codes/card-declined",
    "message": "Your card has insufficient funds.",
    "request_log_url": "https://dashboard.stripe.com/test/logs/req_Lm3nB8vC1xZ5qW?t=1718000060",
    "type": "card_error"
  }
}`), charges.OutcomeDeclined},
		{"400 parameter_missing", 400, stripeBody(400, `{
  "error": {
    "code": "parameter_missing",
    "doc_url": "https://stripe.com/docs/error-codes/parameter-missing",
    "message": "Missing required param: amount.",
    "param": "amount",
    "request_log_url": "https://dashboard.stripe.com/test/logs/req_Qp9sD2fG6hJ1kL?t=1718000120",
    "type": "invalid_request_error"
  }
}`), charges.OutcomeRejected},
		{"400 resource_missing payment method", 400, stripeBody(400, `{
  "error": {
    "code": "resource_missing",
    "doc_url": "https://stripe.com/docs/error-codes/resource-missing",
    "message": "No such PaymentMethod: 'pm_unknown'",
    "param": "payment_method",
    "request_log_url": "https://dashboard.stripe.com/test/logs/req_Zx8cV4bN7mA2sD?t=1718000180",
    "type": "invalid_request_error"
  }
}`), charges.OutcomeRejected},
		{"400 payment_intent_unexpected_state", 400, stripeBody(400, `{
  "error": {
    "code": "payment_intent_unexpected_state",
    "doc_url": "https://stripe.com/docs/error-codes/payment-intent-unexpected-state",
    "message": "This PaymentIntent could not be captured because it has a status of canceled. Only a PaymentIntent with one of the following statuses may be captured: requires_capture.",
    "request_log_url": "https://dashboard.stripe.com/test/logs/req_Wq1eR5tY8uI3oP?t=1718000240",
    "type": "invalid_request_error"
  }
}`), charges.OutcomeRejected},
		{"404 resource_missing", 404, stripeBody(404, `{
  "error": {
    "code": "resource_missing",
    "doc_url": "https://stripe.com/docs/error-codes/resource-missing",
    "message": "No such payment_intent: 'pi_unknown'",
    "param": "intent",
    "request_log_url": "https://dashboard.stripe.com/test/logs/req_As6dF9gH2jK5lZ?t=1718000300",
    "type": "invalid_request_error"
  }
}`), charges.OutcomeRejected},
		// The downstream key reused with other parameters.
		{"400 idempotency_error", 400, stripeBody(400, `{
  "error": {
    "message": "Keys for idempotent requests can only be used with the same parameters they were first used with. Try using a key other than 'idempay_ik_answers_charge' if you meant to execute a different request.",
    "request_log_url": "https://dashboard.stripe.com/test/logs/req_Ty4uI7oP0aS3dF?t=1718000360",
    "type": "idempotency_error"
  }
}`), charges.OutcomeConflict},
		// The downstream key in flight at Stripe: unknown whatever its type.
		{"409 idempotency_key_in_use, idempotency_error", 409, stripeBody(409, `{
  "error": {
    "code": "idempotency_key_in_use",
    "doc_url": "https://stripe.com/docs/error-codes/idempotency-key-in-use",
    "message": "There is currently another in-progress request using this Idempotent Key (that probably means you submitted twice, and the other request is still going through): idempay_ik_answers_charge. Please try again later.",
    "request_log_url": "https://dashboard.stripe.com/test/logs/req_Gh2jK5lZ8xC1vB?t=1718000420",
    "type": "idempotency_error"
  }
}`), charges.OutcomeUnknown},
		{"409 idempotency_key_in_use, invalid_request_error", 409, stripeBody(409, `{
  "error": {
    "code": "idempotency_key_in_use",
    "doc_url": "https://stripe.com/docs/error-codes/idempotency-key-in-use",
    "message": "There is currently another in-progress request using this Idempotent Key (that probably means you submitted twice, and the other request is still going through): idempay_ik_answers_charge. Please try again later.",
    "request_log_url": "https://dashboard.stripe.com/test/logs/req_Nm4bV7cX0zL3kJ?t=1718000480",
    "type": "invalid_request_error"
  }
}`), charges.OutcomeUnknown},
		{"429 rate_limit", 429, stripeBody(429, `{
  "error": {
    "code": "rate_limit",
    "doc_url": "https://stripe.com/docs/error-codes/rate-limit",
    "message": "Request rate limit exceeded. Learn more about rate limits here https://stripe.com/docs/rate-limits.",
    "request_log_url": "https://dashboard.stripe.com/test/logs/req_Pl9oK6iJ3uH0yG?t=1718000540",
    "type": "invalid_request_error"
  }
}`), charges.OutcomeUnknown},
		{"429 lock_timeout", 429, stripeBody(429, `{
  "error": {
    "code": "lock_timeout",
    "doc_url": "https://stripe.com/docs/error-codes/lock-timeout",
    "message": "This object cannot be accessed right now because another API request or Stripe process is currently accessing it. If you see this error intermittently, retry the request. If you see this error frequently and are making multiple concurrent requests to a single object, make your requests serially or at a lower rate.",
    "request_log_url": "https://dashboard.stripe.com/test/logs/req_Fd5sA2qW9eR6tY?t=1718000600",
    "type": "invalid_request_error"
  }
}`), charges.OutcomeUnknown},
		{"401 invalid API key", 401, stripeBody(401, `{
  "error": {
    "message": "Invalid API Key provided: sk_test_********************1234",
    "type": "invalid_request_error"
  }
}`), charges.OutcomeUnknown},
		{"403 restricted key", 403, stripeBody(403, `{
  "error": {
    "message": "The provided key 'rk_test_********************abcd' does not have the required permissions for this endpoint on account 'acct_1PaQqg2eZvKYlo2C'. Having the 'rak_payment_intent_write' permission would allow this request to continue.",
    "request_log_url": "https://dashboard.stripe.com/test/logs/req_Jk8lZ1xC4vB7nM?t=1718000660",
    "type": "invalid_request_error"
  }
}`), charges.OutcomeUnknown},
		{"424 external dependency failed", 424, stripeBody(424, `{
  "error": {
    "message": "The request couldn't be completed due to a failure in a dependency external to Stripe.",
    "request_log_url": "https://dashboard.stripe.com/test/logs/req_Vb3nM6qW9eR2tY?t=1718000720",
    "type": "api_error"
  }
}`), charges.OutcomeUnknown},
		{"500 api_error", 500, stripeBody(500, `{
  "error": {
    "message": "An unknown error occurred",
    "request_log_url": "https://dashboard.stripe.com/test/logs/req_Cx1vB4nM7qW0eR?t=1718000780",
    "type": "api_error"
  }
}`), charges.OutcomeUnknown},
		{"503 api_error", 503, stripeBody(503, `{
  "error": {
    "message": "Stripe is temporarily unavailable. Please try again later.",
    "type": "api_error"
  }
}`), charges.OutcomeUnknown},
		{"502 from a proxy, not Stripe's JSON", 0, func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusBadGateway)
			_, _ = io.WriteString(w, "<html><head><title>502 Bad Gateway</title></head><body>502 Bad Gateway</body></html>")
		}, charges.OutcomeUnknown},
		{"timeout", 0, func(w http.ResponseWriter, r *http.Request) {
			// The body read, the server notices the client hang up.
			_, _ = io.Copy(io.Discard, r.Body)
			<-r.Context().Done() // no answer until the client gives up
		}, charges.OutcomeUnknown},
		{"connection reset", 0, func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				panic(err)
			}
			// SO_LINGER 0: the close sends a RST, not a FIN.
			if err := conn.(*net.TCPConn).SetLinger(0); err != nil {
				panic(err)
			}
			conn.Close()
		}, charges.OutcomeUnknown},
		{"connection refused", 0, nil, charges.OutcomeUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// A server of its own per answer: a fresh connection, which
			// http.Transport never re-sends a request on.
			srv := httptest.NewServer(tc.handler)
			if tc.handler == nil {
				srv.Close() // nothing listens at the address any more
			} else {
				t.Cleanup(srv.Close)
			}
			// Only the answer that never comes needs a timeout a call
			// reaches; every other answer must be read whole, however
			// slowly a loaded machine serves it.
			timeout := time.Minute
			if tc.name == "timeout" {
				timeout = 500 * time.Millisecond
			}
			s := New(Config{SecretKey: "sk_test_answers", URL: srv.URL, Timeout: timeout})
			_, err := s.CreateIntent(context.Background(), charges.IntentRequest{Key: "idempay_ik_answers_charge",
				Amount: 1000, Currency: "usd", PaymentMethod: "pm_card_visa", Capture: true})
			if err == nil {
				t.Fatal("the call succeeded")
			}
			got, se := classify(err)
			if got != tc.want {
				t.Errorf("classified %s, want %s: %v", got, tc.want, err)
			}
			// What the domain reads: a *charges.Refusal for a final answer,
			// with the same outcome; any other error is unknown.
			var r *charges.Refusal
			if errors.As(err, &r) != (tc.want != charges.OutcomeUnknown) || r != nil && r.Outcome != tc.want {
				t.Errorf("the domain reads %#v, want outcome %s", r, tc.want)
			}
			switch {
			case tc.status != 0 && (se == nil || se.HTTPStatusCode != tc.status):
				t.Errorf("stripe-go did not read the answer as Stripe's %d error: %#v", tc.status, err)
			case tc.status == 0 && se != nil:
				t.Errorf("a Stripe error %d %s, want none: %v", se.HTTPStatusCode, se.Type, err)
			}
			if se != nil {
				for i, a := range stripeAnswers {
					if a.matches(se) {
						mu.Lock()
						reached[i] = true
						mu.Unlock()
						break
					}
				}
			}
			switch tc.name {
			case "timeout":
				if ne := net.Error(nil); !errors.As(err, &ne) || !ne.Timeout() {
					t.Errorf("the error is not a timeout: %v", err)
				}
			case "connection reset":
				if !errors.Is(err, syscall.ECONNRESET) {
					t.Errorf("the error is not a connection reset: %v", err)
				}
			case "connection refused":
				if !errors.Is(err, syscall.ECONNREFUSED) {
					t.Errorf("the error is not a refused connection: %v", err)
				}
			}
		})
	}
}
