package bench

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/dbtest"
)

func runBench(t *testing.T, cfg Config) ([]Result, string) {
	t.Helper()
	var out bytes.Buffer
	cfg.DatabaseURL, cfg.Concurrency, cfg.Out = dbtest.URL(), 4, &out
	cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	results, err := Run(context.Background(), cfg)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	return results, out.String()
}

// pacedRequests is how many requests a paced drive of d at rate releases:
// one for each k = 1, 2, ... whose time, k intervals after the start, is
// before the deadline.
func pacedRequests(d time.Duration, rate float64) uint64 {
	interval := time.Duration(float64(time.Second) / rate)
	return uint64((d - 1) / interval)
}

func checkReport(t *testing.T, report string, want, unwanted []string) {
	t.Helper()
	for _, line := range want {
		if !strings.Contains(report, line) {
			t.Errorf("the report has no %q", line)
		}
	}
	for _, line := range unwanted {
		if strings.Contains(report, line) {
			t.Errorf("the report has %q", line)
		}
	}
}

// The whole bench, as `idempay-bench -target` runs it, against a real API on
// the test database: paced, two interleaved rounds, every scenario that a
// target allows. Each one must have sent requests and got only the answers
// it expects (a replay that was not replayed, or a read that failed, counts
// as unexpected), and the report must set the p99s against the floor's.
// Unpaced, it gives the ratio to the raw database instead.
func TestRunAgainstTarget(t *testing.T) {
	env := apitest.New(t, apitest.Options{})
	cfg := Config{Target: env.Server.URL, Duration: 400 * time.Millisecond, Rate: 300, Rounds: 2}
	results, report := runBench(t, cfg)
	want := []string{ScenarioFirst, ScenarioReplay, ScenarioRetry, ScenarioRead, ScenarioRawFirst, ScenarioRawReplay, ScenarioFloor}
	if len(results) != len(want) {
		t.Fatalf("got %d results, want %v (conflict is skipped with a target)", len(results), want)
	}
	for i, res := range results {
		if res.Name != want[i] {
			t.Errorf("result %d is %s, want %s", i, res.Name, want[i])
		}
		// Paced at 300/s for 2 x 400 ms: every request the pace releases
		// is sent, however far a loaded machine falls behind it
		// (TestPacedDriveSendsOneRequestPerInterval).
		want := uint64(cfg.Rounds) * pacedRequests(cfg.Duration, cfg.Rate)
		if res.Requests != want || res.Unexpected != 0 {
			t.Errorf("%s: %d requests (want %d), %d unexpected %v; why: %q", res.Name, res.Requests, want, res.Unexpected, res.Statuses, res.Errors)
		}
	}
	checkReport(t, report,
		[]string{"conflict: skipped", "p99 over the floor (GET /healthz, p99 ", "none in a paced run"},
		[]string{"of the ceiling"})

	results, report = runBench(t, Config{Target: env.Server.URL, Duration: 300 * time.Millisecond,
		Scenarios: []string{ScenarioFirst, ScenarioRawFirst, ScenarioFloor}})
	for _, res := range results {
		if res.Requests == 0 || res.Unexpected != 0 {
			t.Errorf("unpaced %s: %d requests, %d unexpected %v; why: %q", res.Name, res.Requests, res.Unexpected, res.Statuses, res.Errors)
		}
	}
	checkReport(t, report, []string{"first: server ", "% of the ceiling"}, []string{"p99 over the floor"})
}
