package bench

import (
	"encoding/binary"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// timerfdTicker counts the expirations of a periodic timerfd. The file is
// non-blocking, so Go's poller watches it like a socket and the reading
// goroutine wakes as soon as the kernel timer fires (to the microsecond),
// not when the runtime's millisecond epoll timeout runs out.
type timerfdTicker struct {
	f  *os.File
	t0 time.Time
}

func newTicker(interval time.Duration) ticker {
	t, err := newTimerfdTicker(interval)
	if err != nil {
		return newSleepTicker(interval)
	}
	return t
}

func newTimerfdTicker(interval time.Duration) (*timerfdTicker, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("timerfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "bench-pacer")
	ts := unix.NsecToTimespec(interval.Nanoseconds())
	t := &timerfdTicker{f: f, t0: time.Now()}
	if err := unix.TimerfdSettime(fd, 0, &unix.ItimerSpec{Interval: ts, Value: ts}, nil); err != nil {
		f.Close()
		return nil, fmt.Errorf("timerfd_settime: %w", err)
	}
	return t, nil
}

func (t *timerfdTicker) start() time.Time { return t.t0 }

func (t *timerfdTicker) wait() (uint64, error) {
	var b [8]byte
	if _, err := t.f.Read(b[:]); err != nil {
		return 0, err
	}
	return binary.NativeEndian.Uint64(b[:]), nil
}

func (t *timerfdTicker) close() { t.f.Close() }
