package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"

	"github.com/idempay/idempay/internal/app"
	"github.com/idempay/idempay/internal/console"
	"github.com/idempay/idempay/internal/server"
)

// startConsole serves the console on CONSOLE_ADDR (docs/console.md) and
// returns at once, with the function that shuts it down with the API. A
// failure to listen is returned; a later one is logged.
func startConsole(cfg Config, a *app.App, log *slog.Logger) (stop func(context.Context), err error) {
	c, err := console.New(a.Pool, a.Auth, a.Charges, a.MerchantHooks, console.Config{
		Secret: []byte(cfg.ConsoleSecret), LockTimeout: cfg.Idempotency.LockTimeout,
		RetryCeiling: cfg.Idempotency.RetryCeiling, LocalRoutes: a.Runner.LocalRoutes(),
		RowLockWait:    cfg.Idempotency.RowLockWait,
		TracerProvider: a.TracerProvider,
	}, log)
	if err != nil {
		return nil, err
	}
	ln, err := server.ListenAddr(cfg.ConsoleAddr)
	if err != nil {
		return nil, fmt.Errorf("console: listening on %s: %w", cfg.ConsoleAddr, err)
	}
	if cfg.ConsoleSecret == "" {
		log.Warn("CONSOLE_SESSION_SECRET is not set: console sessions are signed with a random secret and end when this process does")
	}
	if host, _, _ := net.SplitHostPort(ln.Addr().String()); !isLoopback(host) {
		log.Warn("the console listens beyond loopback over plain HTTP: put it behind TLS", "addr", ln.Addr().String())
	}
	srv := console.NewServer(cfg.ConsoleAddr, c.Handler())
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("console stopped serving", "err", err)
		}
	}()
	log.Info("console serving", "addr", ln.Addr().String())
	return func(ctx context.Context) { _ = srv.Shutdown(ctx) }, nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
