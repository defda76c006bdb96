// Command natsdev runs an embedded NATS server with JetStream on loopback,
// for development and tests only. It exists so that `make up` and the test
// suites need no NATS installed: scripts/lib.sh (ensure_nats) and
// internal/natstest start it when no NATS server is around. The production
// server binary (cmd/idempay) does not link nats-server; it only talks to a
// NATS server as a client.
//
//	natsdev -store DIR [-addr 127.0.0.1:4222] [-name natsdev]
//	        [-cluster-addr 127.0.0.1:6222 -routes nats-route://127.0.0.1:6223,... -cluster-name idempay-dev]
//
// With -cluster-addr (and usually -routes) JetStream runs clustered. Once the
// server accepts connections it prints one line, `natsdev: ready
// nats://HOST:PORT`, to stdout; it logs to stderr and exits 0 on SIGINT or
// SIGTERM after a clean shutdown. Port 0 in -addr or -cluster-addr picks a
// free port.
package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "natsdev:", err)
		os.Exit(1)
	}
}

func run() error {
	addr := flag.String("addr", "127.0.0.1:4222", "client listen address (loopback only)")
	store := flag.String("store", "", "JetStream store directory (required)")
	name := flag.String("name", "natsdev", "server name")
	clusterAddr := flag.String("cluster-addr", "", "cluster route listen address, host:port (loopback only; optional)")
	routes := flag.String("routes", "", "comma-separated nats-route://127.0.0.1:PORT routes to the other nodes (optional)")
	clusterName := flag.String("cluster-name", "idempay-dev", "cluster name")
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", flag.Args())
	}
	if *store == "" {
		return errors.New("-store is required")
	}

	host, port, err := loopbackHostPort(*addr)
	if err != nil {
		return fmt.Errorf("-addr: %w", err)
	}
	opts := &server.Options{
		ServerName: *name,
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   *store,
		NoSigs:     true, // handled below, so that shutdown is ours
		Logtime:    true,
	}
	if *clusterAddr == "" && *routes != "" {
		return errors.New("-routes needs -cluster-addr")
	}
	if *clusterAddr != "" {
		ch, cp, err := loopbackHostPort(*clusterAddr)
		if err != nil {
			return fmt.Errorf("-cluster-addr: %w", err)
		}
		opts.Cluster = server.ClusterOpts{Name: *clusterName, Host: ch, Port: cp}
		if *routes != "" {
			opts.Routes = server.RoutesFromStr(*routes)
			for _, r := range opts.Routes {
				if !isLoopback(r.Hostname()) {
					return fmt.Errorf("-routes: %s is not a loopback address", r.Host)
				}
			}
		}
	}

	s, err := server.NewServer(opts)
	if err != nil {
		return err
	}
	s.ConfigureLogger()
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return errors.New("server not ready for connections after 10s")
	}
	fmt.Printf("natsdev: ready %s\n", clientURL(s, host))

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	done := make(chan struct{})
	go func() { s.WaitForShutdown(); close(done) }()
	select {
	case got := <-sig:
		s.Noticef("natsdev: %v, shutting down", got)
		s.Shutdown()
		<-done
		return nil
	case <-done:
		return errors.New("server shut down unexpectedly")
	}
}

// loopbackHostPort splits addr and refuses a host that is not a loopback
// address. Port 0 becomes nats-server's "random port".
func loopbackHostPort(addr string) (string, int, error) {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	if !isLoopback(h) {
		return "", 0, fmt.Errorf("host %q is not a loopback address", h)
	}
	if h == "localhost" {
		h = "127.0.0.1"
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("bad port %q", p)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	return h, port, nil
}

func isLoopback(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// clientURL is nats://HOST:PORT of the bound client listener.
func clientURL(s *server.Server, host string) string {
	port := 0
	if a, ok := s.Addr().(*net.TCPAddr); ok {
		port = a.Port
	}
	return (&url.URL{Scheme: "nats", Host: net.JoinHostPort(host, strconv.Itoa(port))}).String()
}
