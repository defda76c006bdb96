package metrics

import (
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// poolCollector reads pgxpool's own statistics at scrape time, so the
// numbers are exact and nothing runs between scrapes.
type poolCollector struct {
	pool *pgxpool.Pool

	acquired, idle, total, max, constructing  *prometheus.Desc
	acquires, acquireSeconds, empty, canceled *prometheus.Desc
	newConns, lifetimeDestroys, idleDestroys  *prometheus.Desc
}

func newPoolCollector(pool *pgxpool.Pool) *poolCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(namespace, "db_pool", name), help, nil, nil)
	}
	return &poolCollector{
		pool:             pool,
		acquired:         d("acquired_conns", "Connections currently checked out of the pool."),
		idle:             d("idle_conns", "Idle connections in the pool."),
		total:            d("total_conns", "All connections in the pool: acquired, idle and being opened."),
		max:              d("max_conns", "The pool's maximum size."),
		constructing:     d("constructing_conns", "Connections being opened."),
		acquires:         d("acquires_total", "Successful acquisitions of a connection from the pool."),
		acquireSeconds:   d("acquire_duration_seconds_total", "Total time spent waiting for a connection; divide its rate by the rate of acquires_total for the mean wait."),
		empty:            d("empty_acquires_total", "Acquisitions that had to wait because no idle connection was available: the pool is too small, or connections are held too long."),
		canceled:         d("canceled_acquires_total", "Acquisitions abandoned because the request's context ended first."),
		newConns:         d("new_conns_total", "Connections opened."),
		lifetimeDestroys: d("max_lifetime_destroys_total", "Connections closed because they reached their maximum lifetime."),
		idleDestroys:     d("max_idle_destroys_total", "Connections closed because they were idle too long."),
	}
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.acquired, c.idle, c.total, c.max, c.constructing,
		c.acquires, c.acquireSeconds, c.empty, c.canceled, c.newConns, c.lifetimeDestroys, c.idleDestroys} {
		ch <- d
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.pool.Stat()
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	counter := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	gauge(c.acquired, float64(s.AcquiredConns()))
	gauge(c.idle, float64(s.IdleConns()))
	gauge(c.total, float64(s.TotalConns()))
	gauge(c.max, float64(s.MaxConns()))
	gauge(c.constructing, float64(s.ConstructingConns()))
	counter(c.acquires, float64(s.AcquireCount()))
	counter(c.acquireSeconds, s.AcquireDuration().Seconds())
	counter(c.empty, float64(s.EmptyAcquireCount()))
	counter(c.canceled, float64(s.CanceledAcquireCount()))
	counter(c.newConns, float64(s.NewConnsCount()))
	counter(c.lifetimeDestroys, float64(s.MaxLifetimeDestroyCount()))
	counter(c.idleDestroys, float64(s.MaxIdleDestroyCount()))
}
