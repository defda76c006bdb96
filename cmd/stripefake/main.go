// Command stripefake serves the test suite's Stripe fake (internal/stripefake)
// as a process, on loopback, for development only: `make up STRIPE=fake`
// runs it instead of stripe-mock. Unlike stripe-mock it keeps the
// PaymentIntents it makes (authorized, captured, canceled), replays a
// repeated Idempotency-Key as Stripe does, and honours Stripe's documented
// test payment methods, so a demo can see every flow:
// pm_card_chargeDeclined (generic_decline) and
// pm_card_chargeDeclinedInsufficientFunds (insufficient_funds) answer 402,
// pm_card_threeDSecure2Required requires_action with a test page that
// completes or fails the authentication, and a payment method that is
// neither pm_ nor tok_ (card_x) a 400 that idempay reports as 422
// payment-rejected. POST /_fake/expire/{payment_intent} expires an
// authorization that was never captured, as Stripe does after some days
// (canceled, cancellation_reason automatic): 200 with the PaymentIntent, 409
// if it is not one that requires_capture. It holds everything in memory
// and forgets it on exit.
//
//	stripefake [-addr 127.0.0.1:12112]
//
// Once it accepts connections it prints one line, `stripefake: ready
// http://HOST:PORT`, to stdout; it exits 0 on SIGINT or SIGTERM. Port 0
// picks a free port.
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/idempay/idempay/internal/stripefake"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "stripefake:", err)
		os.Exit(1)
	}
}

func run() error {
	addr := flag.String("addr", "127.0.0.1:12112", "listen address, host:port (loopback only)")
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", flag.Args())
	}
	host, _, err := net.SplitHostPort(*addr)
	if err != nil {
		return fmt.Errorf("-addr: %w", err)
	}
	if !isLoopback(host) {
		return fmt.Errorf("-addr: host %q is not a loopback address", host)
	}

	// Catch signals before announcing readiness, so that a signal right
	// after the ready line still ends the process cleanly.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)

	l, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	fake := stripefake.NewListener(l)
	fmt.Printf("stripefake: ready %s\n", fake.URL())

	got := <-sig
	fmt.Fprintf(os.Stderr, "stripefake: %v, shutting down\n", got)
	fake.Close()
	return nil
}

func isLoopback(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}
