package server

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// TestListenAddrFromFileDescriptor: "fd:N" serves the listening socket
// passed as file descriptor N, on the address its parent bound; a bad N is
// refused with the form it wants.
func TestListenAddrFromFileDescriptor(t *testing.T) {
	t.Parallel()
	parent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer parent.Close()
	f, err := parent.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fd, err := unix.Dup(int(f.Fd())) // ListenAddr takes this one over, as a child does its inherited one
	if err != nil {
		t.Fatal(err)
	}
	l, err := ListenAddr("fd:" + strconv.Itoa(fd))
	if err != nil {
		t.Fatalf("ListenAddr(fd:%d): %v", fd, err)
	}
	defer l.Close()
	if l.Addr().String() != parent.Addr().String() {
		t.Fatalf("listening on %s, want the passed socket's %s", l.Addr(), parent.Addr())
	}
	parent.Close() // only the passed socket's copy serves now
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) }))
	srv.Listener = l
	srv.Start()
	defer srv.Close()
	resp, err := http.Get("http://" + l.Addr().String() + "/")
	if err != nil {
		t.Fatalf("GET on the passed socket: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTeapot {
		t.Fatalf("GET on the passed socket: %d, want 418 from its server", resp.StatusCode)
	}

	for _, bad := range []string{"fd:", "fd:x", "fd:2", "fd:-1"} {
		if l, err := ListenAddr(bad); err == nil {
			l.Close()
			t.Errorf("ListenAddr(%q) listened on %s, want it refused", bad, l.Addr())
		}
	}
}
