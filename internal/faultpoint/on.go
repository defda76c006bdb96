//go:build faultinject

package faultpoint

import (
	"os"
	"syscall"
)

var armed = os.Getenv("IDEMPAY_FAULT_POINT")

// Hit kills the process with SIGKILL when name is the armed fault point. Like
// a real crash, nothing is flushed, rolled back or answered.
func Hit(name string) {
	if armed != "" && armed == name {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // never returns: the signal is on its way
	}
}
