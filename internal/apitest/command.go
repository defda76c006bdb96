package apitest

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// commandBound bounds one command a test runs: it only catches a command
// that never ends, far beyond what a loaded machine takes.
const commandBound = 2 * time.Minute

// RunCommand runs the program at path with args and exactly env (nothing
// inherited), and returns its stdout, stderr and exit status. A command
// that has not ended within 2 minutes is killed and reported with what it
// printed; one that cannot be started fails the test. name is how failures
// call the program.
func RunCommand(t testing.TB, name, path string, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), commandBound)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = env
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("%s %s: still running after %s (killed: %v); stdout %s; stderr %s",
			name, strings.Join(args, " "), commandBound, err, out.String(), errOut.String())
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
	}
	return out.String(), errOut.String(), code
}
