package metrics

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idempay/idempay/internal/dbsqlc"
)

// MerchantHookOutcomes are the outcomes of an attempt to deliver a webhook
// to a merchant (merchanthooks.Outcomes), created at zero up front.
var MerchantHookOutcomes = []string{"delivered", "retrying", "failed", "gone", "fenced"}

// merchantHooks are the series of webhooks out.
type merchantHooks struct {
	attempts *prometheus.CounterVec
	duration prometheus.Histogram
}

func newMerchantHooks(reg *prometheus.Registry, pool *pgxpool.Pool) merchantHooks {
	h := merchantHooks{
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "webhooks_out", Name: "attempts_total",
			Help: "Attempts to deliver an event to a merchant's endpoint, by outcome: delivered (2xx), retrying (failed, retried on the schedule), failed (failed, the schedule is spent), gone (410: the endpoint is disabled), fenced (the worker's lease had run out; another worker owns the delivery).",
		}, []string{"outcome"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: "webhooks_out", Name: "attempt_duration_seconds",
			Help:    "Time of one attempt, connection to the answer's first 4 KB.",
			Buckets: []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 15},
		}),
	}
	reg.MustRegister(h.attempts, h.duration)
	for _, o := range MerchantHookOutcomes {
		h.attempts.WithLabelValues(o)
	}
	if pool != nil {
		reg.MustRegister(&merchantHookBacklog{pool: pool,
			oldest: prometheus.NewDesc(namespace+"_webhooks_out_oldest_pending_seconds",
				"Age of the oldest delivery not yet sent (pending, or paused while its endpoint is disabled), per endpoint (endpoints with none are absent).", []string{"endpoint"}, nil),
			disabled: prometheus.NewDesc(namespace+"_webhooks_out_disabled_endpoints",
				"Webhook endpoints that are disabled (by their merchant, or by idempay after a 410 or a long failure).", nil, nil),
		})
	}
	return h
}

// ObserveMerchantHook records one attempt to deliver a webhook to a
// merchant; it is the function to set as merchanthooks.Config.Observe.
func (m *Metrics) ObserveMerchantHook(outcome string, d time.Duration) {
	m.hooks.attempts.WithLabelValues(outcome).Inc()
	m.hooks.duration.Observe(d.Seconds())
}

// merchantHookBacklog reads the pending deliveries' ages and the disabled
// endpoints from the database at each scrape.
type merchantHookBacklog struct {
	pool             *pgxpool.Pool
	oldest, disabled *prometheus.Desc
}

func (c *merchantHookBacklog) Describe(ch chan<- *prometheus.Desc) { ch <- c.oldest; ch <- c.disabled }

func (c *merchantHookBacklog) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	q := dbsqlc.New()
	if rows, err := q.WebhookOldestPending(ctx, c.pool); err == nil {
		now := time.Now()
		for _, r := range rows {
			ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, max(0, now.Sub(r.Oldest).Seconds()), r.EndpointID)
		}
	}
	if n, err := q.WebhookEndpointsDisabled(ctx, c.pool); err == nil {
		ch <- prometheus.MustNewConstMetric(c.disabled, prometheus.GaugeValue, float64(n))
	}
}
