// Package nettest holds what tests need of the network beside the
// services they start: an address that refuses connections.
package nettest

import (
	"fmt"
	"syscall"
	"testing"
)

// RefusingAddr is a loopback address that refuses connections for the
// whole test: a socket bound to it that never listens holds the port, so
// no other process can take it and answer (as it could a port found free
// and closed).
func RefusingAddr(t testing.TB) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}
