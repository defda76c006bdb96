package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/idempay/idempay/internal/webhooks"
)

const webhooksUsage = `usage: idempay webhooks trigger TYPE --charge ch_... [--refund re_...] [--status S] [--url URL]

Builds a realistic Stripe event about a charge of the ledger, signs it with
STRIPE_WEBHOOK_SECRET and posts it to the running server (what "stripe
trigger" does against real Stripe). TYPE is one of:
  ` + "%s" + `
--status sets, where the type leaves a choice:
  refund.created, charge.refund.updated, refund.updated: the refund's status,
    succeeded (the default), pending, requires_action, failed or canceled
  charge.dispute.created, .updated, .closed: the dispute's status, any of
    warning_needs_response, warning_under_review, warning_closed (an inquiry),
    needs_response, under_review, won or lost (a chargeback); by default
    needs_response, under_review and lost. Its is_charge_refundable is what
    Stripe sends in that status: true for an inquiry and won, else false
  payment_intent.canceled: the cancellation_reason, automatic (the default),
    abandoned, duplicate, failed_invoice, fraudulent, requested_by_customer
    or void_invoice
--url defaults to http://LISTEN_ADDR/v1/webhooks/stripe.`

// webhooksCmd is `idempay webhooks trigger` and `idempay webhooks listen`.
func webhooksCmd(ctx context.Context, cfg Config, args []string) error {
	if len(args) > 0 && args[0] == "listen" {
		return listenCmd(ctx, cfg, args[1:])
	}
	usage := fmt.Sprintf(webhooksUsage, strings.Join(webhooks.TriggerTypes, ", "))
	if len(args) < 2 || args[0] != "trigger" {
		return errors.New(usage)
	}
	fs := flag.NewFlagSet("webhooks trigger", flag.ContinueOnError)
	var o webhooks.TriggerOptions
	o.Type = args[1]
	fs.StringVar(&o.ChargeID, "charge", "", "idempay's charge id (ch_...)")
	fs.StringVar(&o.RefundID, "refund", "", "idempay's refund id (re_...), for refund events")
	fs.StringVar(&o.Status, "status", "", "the refund's status, the dispute's or the cancellation_reason (see the usage)")
	url := fs.String("url", "", "the webhook endpoint")
	if err := parseFlags(fs, args[2:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return strayArgument(fs, usage)
	}
	if o.ChargeID == "" {
		return errors.New(usage)
	}
	if err := webhooks.CheckTrigger(o); err != nil {
		return err
	}
	if cfg.Webhooks.Secret == "" {
		return errors.New("configuration: STRIPE_WEBHOOK_SECRET is required to sign the event")
	}
	if *url == "" {
		*url = "http://" + clientAddr(cfg.ListenAddr) + webhooks.Route
	}
	pool, err := openPool(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	ev, err := webhooks.Trigger(ctx, pool, o)
	if err != nil {
		return err
	}
	status, _, body, err := webhooks.Send(ctx, &http.Client{Timeout: 30 * time.Second}, *url, ev.Payload,
		webhooks.SignatureHeader(ev.Payload, time.Now(), cfg.Webhooks.Secret))
	if err != nil {
		return fmt.Errorf("posting %s: %w", ev.ID, err)
	}
	fmt.Fprintf(os.Stderr, "%s %s -> %d\n", ev.Type, ev.ID, status)
	fmt.Println(strings.TrimSpace(string(body)))
	if status >= 300 {
		return fmt.Errorf("the endpoint answered %d", status)
	}
	return nil
}

// clientAddr is the address to reach a server listening on addr: a wildcard
// host becomes loopback.
func clientAddr(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	return net.JoinHostPort(host, port)
}
