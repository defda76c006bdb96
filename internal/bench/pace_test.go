package bench

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// An open-loop run releases exactly one request per interval before the
// deadline, however the workers keep up: the count depends on the pace and
// the duration only.
func TestPacedDriveSendsOneRequestPerInterval(t *testing.T) {
	r := &runner{cfg: Config{Concurrency: 4}}
	var calls atomic.Int64
	res := r.drive(context.Background(), "paced", 250*time.Millisecond, 2000, func(ctx context.Context, w, i int) outcome {
		calls.Add(1)
		return outcome{status: "200", ok: true}
	})
	// Request k goes at start + k/2000 s for every k with that time before
	// the deadline: k = 1..499. The count is exact even on a loaded machine:
	// the pacer counts the ticker's elapsed intervals and releases every k
	// they cover, however late it wakes, and the workers drain the queue
	// whatever the clock says by then (drive's own timeout is 35 s away).
	if res.Requests != 499 || calls.Load() != 499 {
		t.Fatalf("paced run made %d requests (%d calls); want 499", res.Requests, calls.Load())
	}
	if res.Statuses["200"] != 499 || res.Unexpected != 0 {
		t.Fatalf("statuses %v, unexpected %d", res.Statuses, res.Unexpected)
	}
}

// Latency is measured from the intended send time, so requests that wait
// behind a slow one count their wait (no coordinated omission): one worker,
// a request every 2 ms, each taking 10 ms, falls further behind with every
// request, and the median latency is far above 10 ms.
func TestPacedDriveCountsQueueingDelay(t *testing.T) {
	r := &runner{cfg: Config{Concurrency: 1}}
	res := r.drive(context.Background(), "queued", 100*time.Millisecond, 500, func(ctx context.Context, w, i int) outcome {
		time.Sleep(10 * time.Millisecond)
		return outcome{status: "200", ok: true}
	})
	// Exact under load for the same reason as above; the latency bounds
	// below are lower bounds, which a slow machine only makes larger.
	if res.Requests != 49 {
		t.Fatalf("made %d requests; want 49 (all released before the deadline are sent)", res.Requests)
	}
	// Request k is released at 2k ms and answered no earlier than 10k ms.
	if res.P50 < 100*time.Millisecond || res.Max < 350*time.Millisecond {
		t.Fatalf("p50 %v, max %v: the wait for the busy worker was not counted", res.P50, res.Max)
	}
}

// The closed loop (no rate) keeps every worker busy until the deadline.
func TestClosedDriveUsesEveryWorker(t *testing.T) {
	r := &runner{cfg: Config{Concurrency: 3}}
	var seen [3]atomic.Int64
	var started atomic.Int64
	// The run would last 2 minutes, a bound for a machine whose cores are
	// busy with other work; it ends as soon as every worker has sent a
	// request, however late a loaded machine started one of them.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := r.drive(ctx, "closed", 2*time.Minute, 0, func(ctx context.Context, w, i int) outcome {
		if seen[w].Add(1) == 1 && started.Add(1) == int64(len(seen)) {
			cancel()
		}
		time.Sleep(time.Millisecond)
		return outcome{status: "200", ok: true}
	})
	for w := range seen {
		if seen[w].Load() == 0 {
			t.Fatalf("worker %d sent nothing (requests by worker: %d, %d, %d)", w, seen[0].Load(), seen[1].Load(), seen[2].Load())
		}
	}
	if res.Requests == 0 || res.Unexpected != 0 {
		t.Fatalf("requests %d, unexpected %d", res.Requests, res.Unexpected)
	}
}

// A closed-loop worker that starts after the deadline (here, every one:
// the run lasts no time at all) still sends its first request, and only
// that one: a run whose workers a busy machine started late measures a
// few requests, not none.
func TestClosedDriveLateWorkerSendsOnce(t *testing.T) {
	r := &runner{cfg: Config{Concurrency: 3}}
	var seen [3]atomic.Int64
	res := r.drive(context.Background(), "late", 0, 0, func(ctx context.Context, w, i int) outcome {
		seen[w].Add(1)
		return outcome{status: "200", ok: true}
	})
	for w := range seen {
		if n := seen[w].Load(); n != 1 {
			t.Errorf("worker %d sent %d requests after the deadline, want its first alone", w, n)
		}
	}
	if res.Requests != 3 || res.Unexpected != 0 {
		t.Fatalf("requests %d, unexpected %d; want 3 (one per worker), 0", res.Requests, res.Unexpected)
	}
}

// Both tickers count every interval that has passed, once: after some
// waits, the ticks returned add up to the intervals elapsed since start.
func TestTickersCountElapsedIntervals(t *testing.T) {
	for name, tk := range map[string]ticker{
		"platform": newTicker(time.Millisecond),
		"sleep":    newSleepTicker(time.Millisecond),
	} {
		t.Run(name, func(t *testing.T) {
			defer tk.close()
			var sum uint64
			for sum < 20 {
				n, err := tk.wait()
				if err != nil {
					t.Fatal(err)
				}
				if n == 0 {
					t.Fatal("wait returned no tick")
				}
				sum += n
				if elapsed := uint64(time.Since(tk.start()) / time.Millisecond); sum > elapsed+1 {
					t.Fatalf("%d ticks after %d intervals", sum, elapsed)
				}
			}
		})
	}
}

// An unexpected answer is counted with its reason, and the report prints
// the reason under the count: the first few distinct ones, each once.
func TestDriveKeepsWhyAnswersWereUnexpected(t *testing.T) {
	r := &runner{cfg: Config{Concurrency: 2}}
	res := r.drive(context.Background(), "failing", 100*time.Millisecond, 200, func(ctx context.Context, w, i int) outcome {
		if i%2 == 0 {
			return outcome{status: "200", ok: true}
		}
		return statusOutcome(reply{status: 503, body: []byte(`{"type":"service-unavailable"}`)}, nil, 200)
	})
	res.summarize()
	want := `503, want 200: {"type":"service-unavailable"}`
	if res.Unexpected == 0 || len(res.Errors) != 1 || res.Errors[0] != want {
		t.Fatalf("%d unexpected, reasons %q; want some, and the one reason %q", res.Unexpected, res.Errors, want)
	}
	var out strings.Builder
	printResult(&out, res)
	if !strings.Contains(out.String(), "unexpected: "+want) {
		t.Fatalf("the report does not say why:\n%s", out.String())
	}
}
