package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/idempay/idempay/client"
	"github.com/idempay/idempay/internal/listing"
)

const clientUsage = `usage:
  idempay charges create --amount N --payment-method PM [--capture=false] [--currency usd] [--description D] [--metadata k=v ...] [--idempotency-key K]
  idempay charges capture ID [--amount N] [--idempotency-key K]
  idempay charges cancel ID [--idempotency-key K]
  idempay charges get ID
  idempay charges list [--limit N] [--starting-after ID]
  idempay refunds create --charge ch_... --amount N [--idempotency-key K]
  idempay refunds get ID
  idempay keys get KEY
  idempay api-keys create [--idempotency-key K]
  idempay api-keys list [--limit N] [--starting-after ID]
  idempay api-keys revoke ID [--idempotency-key K]

These call a running API with the Go client (package client), retrying with
the same Idempotency-Key until a final answer. They read IDEMPAY_API_URL
(default http://LISTEN_ADDR) and IDEMPAY_API_KEY. The answer is printed as
JSON on stdout; an error answer is printed as its problem JSON on stderr and
the exit status is 1. A create without --idempotency-key makes a new key and
prints it on stderr: run the command again with it to retry the same
request. api-keys create prints the new key's secret once: keep it, the
server does not.`

// clientCmd is `idempay charges|refunds|keys|api-keys ...`: the API from
// the command line, through the same client (and retry rules) as Go
// callers.
func clientCmd(ctx context.Context, cfg Config, args []string) error {
	if len(args) < 2 {
		return errors.New(clientUsage)
	}
	apiKey := os.Getenv("IDEMPAY_API_KEY")
	if apiKey == "" {
		return errors.New("IDEMPAY_API_KEY is required (idempay accounts create prints one)")
	}
	baseURL := os.Getenv("IDEMPAY_API_URL")
	if baseURL == "" {
		baseURL = "http://" + clientAddr(cfg.ListenAddr)
	}
	cl := client.New(baseURL, apiKey)

	var res raw
	var err error
	switch args[0] + " " + args[1] {
	case "charges create":
		res, err = chargesCreate(ctx, cl, args[2:])
	case "charges capture":
		res, err = chargesCapture(ctx, cl, args[2:])
	case "charges cancel":
		res, err = withKey(args[2:], 1, func(id []string, opt client.CallOption) (raw, error) {
			return cl.Charges.Cancel(ctx, id[0], opt)
		})
	case "charges get":
		res, err = withID(args[2:], func(id string) (raw, error) { return cl.Charges.Get(ctx, id) })
	case "charges list":
		var p client.ListParams
		if p, err = listParams("charges list", "a charge id", args[2:]); err == nil {
			res, err = cl.Charges.List(ctx, p)
		}
	case "refunds create":
		res, err = refundsCreate(ctx, cl, args[2:])
	case "refunds get":
		res, err = withID(args[2:], func(id string) (raw, error) { return cl.Refunds.Get(ctx, id) })
	case "keys get":
		res, err = withID(args[2:], func(id string) (raw, error) { return cl.IdempotencyKeys.Get(ctx, id) })
	case "api-keys create":
		res, err = withKey(args[2:], 0, func(_ []string, opt client.CallOption) (raw, error) { return cl.APIKeys.Create(ctx, opt) })
	case "api-keys list":
		var p client.ListParams
		if p, err = listParams("api-keys list", "an API key id", args[2:]); err == nil {
			res, err = cl.APIKeys.List(ctx, p)
		}
	case "api-keys revoke":
		res, err = withKey(args[2:], 1, func(id []string, opt client.CallOption) (raw, error) {
			if err := cl.APIKeys.Delete(ctx, id[0], opt); err != nil {
				return nil, err
			}
			fmt.Printf("revoked %s\n", id[0])
			return nil, nil
		})
	default:
		return errors.New(clientUsage)
	}
	var apiErr *client.Error
	if errors.As(err, &apiErr) {
		printJSON(os.Stderr, apiErr.Body)
		if apiErr.IdempotencyKey != "" {
			fmt.Fprintf(os.Stderr, "Idempotency-Key: %s\n", apiErr.IdempotencyKey)
		}
		return err
	}
	if err != nil || res == nil {
		return err
	}
	if k := res.IdempotencyKey(); k != "" {
		fmt.Fprintf(os.Stderr, "Idempotency-Key: %s (replayed: %v)\n", k, res.Replayed())
	}
	printJSON(os.Stdout, res.RawBody())
	return nil
}

// raw is what every result has through its client.Meta.
type raw interface {
	RawBody() []byte
	IdempotencyKey() string
	Replayed() bool
}

func chargesCreate(ctx context.Context, cl *client.Client, args []string) (raw, error) {
	fs := flag.NewFlagSet("charges create", flag.ContinueOnError)
	amount := fs.Int64("amount", 0, "amount in the currency's minor unit (required)")
	currency := fs.String("currency", "usd", "ISO 4217 currency")
	pm := fs.String("payment-method", "", "a Stripe PaymentMethod such as pm_card_visa (required)")
	capture := fs.Bool("capture", true, "false authorizes only: capture later with `charges capture`")
	description := fs.String("description", "", "description")
	key := fs.String("idempotency-key", "", "the request's key (default: a new one)")
	meta := metadataFlag{}
	fs.Var(meta, "metadata", "a key=value pair; repeat for more")
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	if *amount == 0 || *pm == "" || fs.NArg() > 0 {
		return nil, errors.New(clientUsage)
	}
	p := client.ChargeParams{Amount: *amount, Currency: *currency, PaymentMethod: *pm}
	if flagSet(fs, "description") {
		p.Description = description
	}
	if len(meta) > 0 {
		p.Metadata = meta
	}
	if !*capture {
		p.Capture = capture
	}
	return cl.Charges.Create(ctx, p, client.WithIdempotencyKey(*key))
}

// chargesCapture is `charges capture ID [--amount N]`: all that the
// authorization holds, or N of it.
func chargesCapture(ctx context.Context, cl *client.Client, args []string) (raw, error) {
	fs := flag.NewFlagSet("charges capture", flag.ContinueOnError)
	amount := fs.Int64("amount", 0, "amount to capture (default: all that is capturable)")
	key := fs.String("idempotency-key", "", "the request's key (default: a new one)")
	var pos []string
	for len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		pos, args = append(pos, args[0]), args[1:]
	}
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	pos = append(pos, fs.Args()...)
	if len(pos) != 1 || pos[0] == "" {
		return nil, errors.New(clientUsage)
	}
	var p client.CaptureParams
	if flagSet(fs, "amount") {
		p.Amount = amount
	}
	return cl.Charges.Capture(ctx, pos[0], p, client.WithIdempotencyKey(*key))
}

// listParams reads the flags of a list command (charges list, api-keys
// list): --limit and --starting-after, nothing else.
func listParams(name, cursor string, args []string) (client.ListParams, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	limit := fs.Int("limit", 0, "page size, 1 to 100 (default 10)")
	after := fs.String("starting-after", "", cursor+": the page starts after it")
	if err := parseFlags(fs, args); err != nil {
		return client.ListParams{}, err
	}
	if fs.NArg() > 0 {
		return client.ListParams{}, errors.New(clientUsage)
	}
	// The client reads a Limit of 0 as the server's default: --limit 0
	// would list 10 where the flag says 1 to 100.
	if flagSet(fs, "limit") && (*limit < 1 || *limit > listing.MaxLimit) {
		return client.ListParams{}, fmt.Errorf("%s: --limit must be an integer between 1 and %d, not %d", name, listing.MaxLimit, *limit)
	}
	return client.ListParams{Limit: *limit, StartingAfter: *after}, nil
}

func refundsCreate(ctx context.Context, cl *client.Client, args []string) (raw, error) {
	fs := flag.NewFlagSet("refunds create", flag.ContinueOnError)
	charge := fs.String("charge", "", "the charge to refund (required)")
	amount := fs.Int64("amount", 0, "amount to refund, in the currency's minor unit (required)")
	key := fs.String("idempotency-key", "", "the request's key (default: a new one)")
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	if *charge == "" || !flagSet(fs, "amount") || fs.NArg() > 0 {
		return nil, errors.New(clientUsage)
	}
	p := client.RefundParams{Charge: *charge, Amount: amount}
	return cl.Refunds.Create(ctx, p, client.WithIdempotencyKey(*key))
}

// withKey parses an --idempotency-key flag (none when positional is -1)
// and exactly positional arguments, and runs call with them.
func withKey(args []string, positional int, call func(args []string, opt client.CallOption) (raw, error)) (raw, error) {
	fs := flag.NewFlagSet("api-keys", flag.ContinueOnError)
	var key *string
	if positional >= 0 {
		key = fs.String("idempotency-key", "", "the request's key (default: a new one)")
	}
	// The ID may come before the flags (revoke ID --idempotency-key K).
	var pos []string
	for len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		pos, args = append(pos, args[0]), args[1:]
	}
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	pos = append(pos, fs.Args()...)
	if len(pos) != max(positional, 0) || slices.Contains(pos, "") {
		return nil, errors.New(clientUsage)
	}
	var opt client.CallOption
	if key != nil {
		opt = client.WithIdempotencyKey(*key)
	}
	return call(pos, opt)
}

// withID runs get with the one positional argument.
func withID(args []string, get func(string) (raw, error)) (raw, error) {
	if len(args) != 1 || args[0] == "" || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" {
		return nil, errors.New(clientUsage)
	}
	return get(args[0])
}

// flagSet reports whether name was given on the command line, so that an
// absent optional member stays absent from the request (an empty
// description and no description are different requests).
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// metadataFlag collects --metadata key=value pairs.
type metadataFlag map[string]string

func (m metadataFlag) String() string { return fmt.Sprint(map[string]string(m)) }

// repeatable: --metadata is given once per key (Set refuses a key twice).
func (metadataFlag) repeatable() {}

func (m metadataFlag) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("metadata %q: want key=value", v)
	}
	if _, twice := m[k]; twice {
		return fmt.Errorf("metadata key %q is given twice", k)
	}
	m[k] = val
	return nil
}

// printJSON writes body indented, or as it is when it is not JSON.
func printJSON(w io.Writer, body []byte) {
	body = bytes.TrimSpace(body)
	var buf bytes.Buffer
	if json.Indent(&buf, body, "", "  ") != nil {
		buf.Reset()
		buf.Write(body)
	}
	buf.WriteByte('\n')
	_, _ = w.Write(buf.Bytes())
}
