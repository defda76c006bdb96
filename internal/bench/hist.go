package bench

import (
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// histogram records latencies in microseconds, from 1 µs to 1 minute, with
// three significant digits (HdrHistogram): constant memory over a long run,
// percentiles within 0.1 %.
type histogram struct {
	h *hdrhistogram.Histogram
}

func newHistogram() *histogram {
	return &histogram{h: hdrhistogram.New(1, int64(time.Minute/time.Microsecond), 3)}
}

// record adds one latency; anything beyond the range counts as its bound.
func (h *histogram) record(d time.Duration) {
	us := max(1, min(d.Microseconds(), h.h.HighestTrackableValue()))
	_ = h.h.RecordValue(us) // in range by construction
}

func (h *histogram) merge(o *histogram) { h.h.Merge(o.h) }

// count is the number of latencies recorded.
func (h *histogram) count() uint64 { return uint64(h.h.TotalCount()) }

// max is the largest latency recorded.
func (h *histogram) max() time.Duration { return time.Duration(h.h.Max()) * time.Microsecond }

// quantile returns the latency at quantile q (0..1).
func (h *histogram) quantile(q float64) time.Duration {
	return time.Duration(h.h.ValueAtQuantile(q*100)) * time.Microsecond
}
