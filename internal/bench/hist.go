package bench

import (
	"math"
	"time"
)

// histogram records latencies in logarithmic buckets 1% wide, so a long run
// uses constant memory and percentiles are within 1% of the true value.
type histogram struct {
	counts []uint64
	n      uint64
	max    time.Duration
}

const histGrowth = 1.01

var histLogBase = math.Log(histGrowth)

func newHistogram() *histogram { return &histogram{counts: make([]uint64, 2600)} }

func (h *histogram) record(d time.Duration) {
	if d < time.Microsecond {
		d = time.Microsecond
	}
	i := int(math.Log(float64(d)/1e3) / histLogBase)
	if i >= len(h.counts) {
		i = len(h.counts) - 1
	}
	h.counts[i]++
	h.n++
	if d > h.max {
		h.max = d
	}
}

func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	if o.max > h.max {
		h.max = o.max
	}
}

// quantile returns the upper bound of the bucket holding quantile q.
func (h *histogram) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	if rank == 0 {
		rank = 1
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			d := time.Duration(1e3 * math.Pow(histGrowth, float64(i+1)))
			return min(d, h.max)
		}
	}
	return h.max
}
