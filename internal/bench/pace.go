package bench

import "time"

// An open-loop run sends request k (k = 1, 2, ...) at start + k*interval,
// whatever the server is doing, and measures each latency from that
// intended time, so a stall counts in full for every request it delays
// (no coordinated omission). The pace must therefore be kept precisely:
// lateness of the load generator's own timer would be counted as latency.
//
// Go's timers are not precise enough for this. When the process is idle, the
// runtime sleeps in epoll_wait, whose timeout is in whole milliseconds, so a
// timer due in less than a millisecond fires up to a millisecond late; at
// the rates the bench runs, that lateness would be a large part of the
// latencies it reports (see BENCHMARKS.md). A ticker therefore counts
// expirations of a kernel timer instead (pace_linux.go: a periodic timerfd,
// which the runtime's poller wakes on at once).
type ticker interface {
	// start is the time the ticks count from.
	start() time.Time
	// wait blocks until at least one more tick is due and returns how many
	// have come due since the last call.
	wait() (uint64, error)
	close()
}

// sleepTicker is the portable fallback: it sleeps with Go's timers, so on an
// idle machine it is late by up to a millisecond, and the latencies it
// measures are that much too high.
type sleepTicker struct {
	t0       time.Time
	interval time.Duration
	seen     uint64
}

func newSleepTicker(interval time.Duration) *sleepTicker {
	return &sleepTicker{t0: time.Now(), interval: interval}
}

func (s *sleepTicker) start() time.Time { return s.t0 }

func (s *sleepTicker) wait() (uint64, error) {
	next := s.t0.Add(s.interval * time.Duration(s.seen+1))
	if d := time.Until(next); d > 0 {
		time.Sleep(d)
	}
	due := uint64(time.Since(s.t0) / s.interval)
	n := due - s.seen
	s.seen = due
	return n, nil
}

func (s *sleepTicker) close() {}
