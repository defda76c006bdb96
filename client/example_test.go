package client_test

import (
	"context"
	"fmt"
	"os"

	"github.com/idempay/idempay/client"
)

// A charge made with the caller's own key (the order it pays for), and
// what each kind of error means.
func ExampleChargesService_Create() {
	ctx := context.Background()
	cl := client.New("http://127.0.0.1:8080", os.Getenv("IDEMPAY_API_KEY"))
	ch, err := cl.Charges.Create(ctx, client.ChargeParams{Amount: 2000, Currency: "usd", PaymentMethod: "tok_visa"},
		client.WithIdempotencyKey("order-1042"))
	// A final answer is returned as it is; the last answer of a call that
	// gave up (a 503, or a 429 or 408 that is not final either) is wrapped.
	e, final := err.(*client.Error) //nolint:errorlint // the point: only a final answer is a bare *client.Error
	switch {
	case err == nil:
		fmt.Println("charged", ch.ID, "replayed:", ch.Replayed())
	case final && e.Code() == "card-declined":
		// Final, and stored under the key: paying again needs a new key.
		fmt.Println("declined:", e.Extensions["decline_code"])
	case final && e.Status != 409:
		// Final: fix the request (e.InvalidParams) before trying again.
		fmt.Println("refused:", e)
	default:
		// No final answer (the call ran out of attempts or time), or a 409
		// that leaves the outcome to the server (idempotency-key-parked):
		// the charge may or may not have happened. Calling again later with
		// the same key finds out without charging twice.
		fmt.Println("unknown, retry later with key order-1042:", err)
	}
}
