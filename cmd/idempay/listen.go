package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/idempay/idempay/client"
)

const listenUsage = `usage: idempay webhooks listen [--addr 127.0.0.1:8082] [--secret whsec_...] [--register] [--fail-first N] [--fail-for D]

Serves a local endpoint for idempay's webhooks out and prints each delivery
with its webhook-id and what a careful receiver does with it (the Go
client's WebhookHandler): applied (signature valid), duplicate id, older
version ignored, or rejected (bad signature, timestamp out of tolerance).
--secret is the endpoint's signing secret (twice, comma-separated, during a
rotation); --register instead registers http://ADDR/ as an endpoint of the
account of IDEMPAY_API_KEY at IDEMPAY_API_URL for every event type
(replacing one registered at the same URL before) and uses the secret it
shows. The server must allow it: WEBHOOK_ALLOW_PRIVATE=on and
WEBHOOK_ALLOW_HTTP=on. --fail-first N and --fail-for D answer 500 to the
first N deliveries, or for D after the start, to show idempay's retries.`

// listenCmd is `idempay webhooks listen`: the receiving end of webhooks out,
// for a demo, the way "stripe listen" is for Stripe's.
func listenCmd(ctx context.Context, cfg Config, args []string) error {
	fs := flag.NewFlagSet("webhooks listen", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:8082", "the address to listen on")
	secrets := fs.String("secret", os.Getenv("IDEMPAY_WEBHOOK_SECRET"), "the endpoint's signing secret(s), comma-separated")
	register := fs.Bool("register", false, "register this listener as an endpoint of the account (IDEMPAY_API_URL, IDEMPAY_API_KEY)")
	failFirst := fs.Int("fail-first", 0, "answer 500 to the first N deliveries")
	failFor := fs.Duration("fail-for", 0, "answer 500 for this long after the start")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 { // a second secret given apart, not after a comma
		return strayArgument(fs, listenUsage)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", *addr, err)
	}
	defer ln.Close()
	url := "http://" + clientAddr(ln.Addr().String()) + "/"
	if *register {
		id, secret, err := registerListener(ctx, cfg, url)
		if err != nil {
			return err
		}
		fmt.Printf("registered %s as webhook endpoint %s; its signing secret is %s\n", url, id, secret)
		*secrets = secret
	}
	if *secrets == "" {
		return errors.New("webhooks listen: --secret (or IDEMPAY_WEBHOOK_SECRET) or --register is required")
	}
	v, err := client.NewWebhookVerifier(strings.Split(*secrets, ",")...)
	if err != nil {
		return err
	}
	l := &listener{out: os.Stdout, verifier: v, failFirst: *failFirst, failUntil: time.Now().Add(*failFor)}
	l.handler = &client.WebhookHandler{Verifier: v, Observe: l.print}
	fmt.Printf("listening on %s (Ctrl-C to stop)\n", url)
	srv := &http.Server{Handler: l, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// listener prints each delivery and answers it through the example
// handler, or with a 500 while it is told to fail.
type listener struct {
	out       io.Writer
	verifier  *client.WebhookVerifier
	handler   *client.WebhookHandler
	failUntil time.Time

	mu        sync.Mutex
	failFirst int
}

func (l *listener) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	l.mu.Lock()
	fail := l.failFirst > 0 || time.Now().Before(l.failUntil)
	if l.failFirst > 0 {
		l.failFirst--
	}
	l.mu.Unlock()
	if !fail {
		l.handler.ServeHTTP(w, r)
		return
	}
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	ev, err := l.verifier.Verify(r.Header, body)
	verdict := "signature valid"
	if err != nil {
		verdict = "rejected: " + err.Error()
	}
	l.line(r.Header.Get(client.HeaderWebhookID), ev, fmt.Sprintf("500 (told to fail; %s)", verdict))
	http.Error(w, "failing on purpose (--fail-first, --fail-for)", http.StatusInternalServerError)
}

// print is the handler's Observe: one line per delivery.
func (l *listener) print(id string, ev *client.Event, v client.WebhookVerdict, err error) {
	var what string
	switch v {
	case client.WebhookApplied:
		what = "200 applied (signature valid)"
	case client.WebhookDuplicate:
		what = "200 duplicate id: already applied, acknowledged"
	case client.WebhookStale:
		what = "200 older version ignored"
	case client.WebhookRejected:
		status := "400"
		if errors.Is(err, client.ErrWebhookTooLarge) {
			status = "413"
		}
		what = status + " rejected: " + strings.TrimPrefix(err.Error(), "idempay: webhook: ")
	default:
		what = fmt.Sprintf("500 %s: %v", v, err)
	}
	l.line(id, ev, what)
}

func (l *listener) line(id string, ev *client.Event, what string) {
	about := "-"
	if ev != nil {
		about = fmt.Sprintf("%s %s v%d", ev.Type, ev.ObjectID, ev.ObjectVersion)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.out, "%s  %s  %s  -> %s\n", time.Now().Format("15:04:05"), id, about, what)
}

// registerListener registers url as an endpoint of the account for every
// event type, after deleting the endpoints registered at url before (a
// listener started again), and returns its id and secret.
func registerListener(ctx context.Context, cfg Config, url string) (string, string, error) {
	apiKey := os.Getenv("IDEMPAY_API_KEY")
	if apiKey == "" {
		return "", "", errors.New("webhooks listen --register: IDEMPAY_API_KEY is required")
	}
	base := os.Getenv("IDEMPAY_API_URL")
	if base == "" {
		base = "http://" + clientAddr(cfg.ListenAddr)
	}
	base = strings.TrimRight(base, "/")
	hc := &http.Client{Timeout: 30 * time.Second}
	call := func(method, path string, body any, out any) error {
		var rd io.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
		req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+apiKey)
		if method == http.MethodPost {
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", "listen-"+rand.Text())
		}
		resp, err := hc.Do(req)
		if err != nil {
			return fmt.Errorf("%s %s: %w", method, path, err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode >= 300 {
			return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, bytes.TrimSpace(raw))
		}
		return json.Unmarshal(raw, out)
	}
	type endpoint struct {
		ID, URL string
		Secret  string
	}
	var list struct{ Data []endpoint }
	if err := call(http.MethodGet, "/v1/webhook_endpoints", nil, &list); err != nil {
		return "", "", err
	}
	for _, ep := range list.Data {
		if ep.URL == url {
			var deleted any
			if err := call(http.MethodDelete, "/v1/webhook_endpoints/"+ep.ID, nil, &deleted); err != nil {
				return "", "", err
			}
		}
	}
	var ep endpoint
	if err := call(http.MethodPost, "/v1/webhook_endpoints", map[string]any{"url": url, "enabled_events": []string{"*"}}, &ep); err != nil {
		return "", "", err
	}
	return ep.ID, ep.Secret, nil
}
