package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// webhooksEnv turns webhooks out on in the started server when the bench
// registers endpoints (Config.WebhookEndpoints): a fresh secrets key, and
// endpoints on loopback over http (the bench's sink).
func webhooksEnv(cfg Config) []string {
	if cfg.WebhookEndpoints <= 0 {
		return nil
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	// A new key per run: the endpoints of an earlier run are deleted first
	// (registerEndpoints), so none is left sealed under another key.
	return []string{"WEBHOOK_SECRETS_KEY=" + base64.StdEncoding.EncodeToString(key),
		"WEBHOOK_ALLOW_PRIVATE=on", "WEBHOOK_ALLOW_HTTP=on"}
}

// startSink serves a merchant's endpoint that answers every delivery 200,
// on loopback; the returned function stops it.
func startSink() (string, func(), error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("starting the webhook sink: %w", err)
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusOK)
	})}
	go func() { _ = srv.Serve(l) }()
	return "http://" + l.Addr().String() + "/", func() { _ = srv.Close() }, nil
}

// registerEndpoints deletes the webhook endpoints of earlier runs (their
// sinks are gone, and their secrets sealed under another key) and their
// deliveries, then registers n endpoints at url, for every event type, on
// each account, through the API.
func registerEndpoints(ctx context.Context, pool *pgxpool.Pool, base string, accounts []account, n int, url string) error {
	if _, err := pool.Exec(ctx, "DELETE FROM webhook_endpoints"); err != nil {
		return fmt.Errorf("deleting the webhook endpoints of earlier runs: %w", err)
	}
	for _, a := range accounts {
		for i := range n {
			body, _ := json.Marshal(map[string]any{"url": url, "enabled_events": []string{"*"}})
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/webhook_endpoints", bytes.NewReader(body))
			if err != nil {
				return err
			}
			req.Header.Set("Authorization", a.auth)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", fmt.Sprintf("bench-endpoint-%s-%d", a.id, i))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return fmt.Errorf("registering a webhook endpoint: %w", err)
			}
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				return fmt.Errorf("registering a webhook endpoint: %d %s", resp.StatusCode, raw)
			}
		}
	}
	return nil
}
