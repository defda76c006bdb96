package bench

import (
	"io"
	"net/http"
	"os"
	"testing"

	"github.com/idempay/idempay/internal/server"
)

// TestMain lets TestServerInheritsItsListener run this test binary as the
// server the bench starts: with IDEMPAY_BENCH_TEST_SERVE=1 it listens as
// idempay serve does (server.ListenAddr of LISTEN_ADDR), answers /readyz,
// and says at /listen_addr what LISTEN_ADDR it was given.
func TestMain(m *testing.M) {
	if os.Getenv("IDEMPAY_BENCH_TEST_SERVE") == "1" {
		addr := os.Getenv("LISTEN_ADDR")
		l, err := server.ListenAddr(addr)
		if err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/readyz", func(http.ResponseWriter, *http.Request) {})
		mux.HandleFunc("/listen_addr", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, addr) })
		_ = http.Serve(l, mux) // until the bench stops the process
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestServerInheritsItsListener: the bench starts idempay on a socket that
// it listens on itself and passes to the process (LISTEN_ADDR=fd:3, as the
// e2e harness does), so the port is never free between its choice and the
// server's start, when another process could take it (and the bench would
// measure that process, or fail to start). It passed the address of a
// port found free and closed.
func TestServerInheritsItsListener(t *testing.T) {
	t.Setenv("IDEMPAY_BENCH_TEST_SERVE", "1")
	srv, err := startServer(t.Context(), Config{Executable: os.Args[0]}, "http://127.0.0.1:1", "")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.stop()
	resp, err := http.Get(srv.base + "/listen_addr")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, _ := io.ReadAll(resp.Body)
	if string(got) != "fd:3" {
		t.Errorf("the server was started with LISTEN_ADDR=%s, want fd:3: a socket the bench listens on and passes", got)
	}
}
