package client_test

import (
	"context"
	"errors"
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
	var e *client.Error
	switch {
	case err == nil:
		fmt.Println("charged", ch.ID, "replayed:", ch.Replayed())
	case errors.As(err, &e) && e.Code() == "card-declined":
		// Final, and stored under the key: paying again needs a new key.
		fmt.Println("declined:", e.Extensions["decline_code"])
	case errors.As(err, &e) && e.Status < 500 && e.Status != 409:
		// Final: fix the request (e.InvalidParams) before trying again.
		fmt.Println("refused:", e)
	default:
		// No final answer (the call ran out of attempts or time): the
		// charge may or may not have happened. Calling again later with the
		// same key finds out without charging twice.
		fmt.Println("unknown, retry later with key order-1042:", err)
	}
}
