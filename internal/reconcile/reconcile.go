// Package reconcile compares what Stripe holds with the ledger: a pass
// lists the PaymentIntents and the refunds created in a window and hands
// each to the payment domain (charges.Service.RepairIntent, RepairRefund),
// which settles a charge or refund that is behind Stripe, re-creates a
// record and ledger row that the database lost, or flags what idempay never
// made. `idempay reconcile` runs one pass; `idempay serve` runs them
// periodically (Run).
package reconcile

import (
	"context"
	"log/slog"
	"time"

	"github.com/idempay/idempay/internal/charges"
)

// The objects a pass lists at Stripe, as passed to Reconciler.OnReconcile.
const (
	ObjectPaymentIntent = "payment_intent"
	ObjectRefund        = "refund"
)

// Reconciler runs reconciliation passes.
type Reconciler struct {
	payments *charges.Service
	stripe   charges.Processor
	log      *slog.Logger
	// OnReconcile, when set, counts what a pass did with each object it
	// listed (metrics): ObjectPaymentIntent or ObjectRefund, and one of the
	// charges.Reconcile* outcomes.
	OnReconcile func(object, outcome string)
}

// New returns a Reconciler of payments, which lists at stripe.
func New(payments *charges.Service, stripe charges.Processor, log *slog.Logger) *Reconciler {
	return &Reconciler{payments: payments, stripe: stripe, log: log}
}

// Report counts what a pass did, by the charges.Reconcile* outcomes: with
// the PaymentIntents it listed (Listed, Counts) and with the refunds
// (RefundsListed, RefundCounts).
type Report struct {
	Since         time.Time      `json:"since"`
	Listed        int            `json:"listed"`
	Counts        map[string]int `json:"counts"`
	RefundsListed int            `json:"refunds_listed"`
	RefundCounts  map[string]int `json:"refund_counts"`
}

// Reconcile is one pass over the PaymentIntents and then the refunds
// created since since. PaymentIntents go first, so that a refund whose
// charge was lost too finds it re-created. Each repair is one log line and
// one count. It is safe to run at any time and from several processes:
// every write goes through the idempotency runner.
func (r *Reconciler) Reconcile(ctx context.Context, since time.Time) (Report, error) {
	report := Report{Since: since.UTC(), Counts: map[string]int{}, RefundCounts: map[string]int{}}
	// count records one object's outcome; a failed repair is logged and
	// left to the next pass, unless the pass itself is ending.
	count := func(object, id string, counts map[string]int, outcome string, err error) error {
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r.log.ErrorContext(ctx, "reconcile: repair failed; the next pass tries again",
				"object", object, "stripe_id", id, "err", err)
			outcome = charges.ReconcileFailed
		}
		counts[outcome]++
		if r.OnReconcile != nil {
			r.OnReconcile(object, outcome)
		}
		return nil
	}
	err := r.stripe.ListIntents(ctx, since, func(pi *charges.PaymentIntent) error {
		report.Listed++
		outcome, err := r.payments.RepairIntent(ctx, pi)
		return count(ObjectPaymentIntent, pi.ID, report.Counts, outcome, err)
	})
	if err != nil {
		return report, err
	}
	err = r.stripe.ListRefunds(ctx, since, func(sr *charges.StripeRefund) error {
		report.RefundsListed++
		outcome, err := r.payments.RepairRefund(ctx, sr)
		return count(ObjectRefund, sr.ID, report.RefundCounts, outcome, err)
	})
	return report, err
}

// Reach is how far back Run's longer passes look, for records parked at
// retryCeiling: twice the ceiling and an hour (Run).
func Reach(retryCeiling time.Duration) time.Duration { return 2*retryCeiling + time.Hour }

// FirstPassAfter is how soon after start Run makes its first pass (or
// after one interval, if that is shorter).
const FirstPassAfter = 5 * time.Second

// Run runs a pass shortly after it starts (FirstPassAfter), then every
// interval until ctx ends, each over a window of twice the interval and at
// least an hour, so that consecutive passes overlap and one that failed is
// covered by the next. The first pass does not wait a whole interval: a
// process restarted more often than that (deploys, a crash loop) would
// never reconcile, and the process started after a failover is the one
// that should repair what it lost.
//
// The first pass, and then one in every quarter of reach, looks back reach
// instead (0: never). A record parked at the retry ceiling (I16) is left
// to Stripe's events and reconciliation, and it parks only once it is a
// ceiling old, and its PaymentIntent with it: a window of an hour never
// lists that PaymentIntent again. serve's reach, twice the ceiling and an
// hour, lists every PaymentIntent a parked record can have for more than
// a ceiling after the record parks, so at least two of these longer passes
// settle it whatever its event did.
func (r *Reconciler) Run(ctx context.Context, interval, reach time.Duration) {
	window := max(2*interval, time.Hour)
	t := time.NewTimer(min(interval, FirstPassAfter))
	defer t.Stop()
	var lastLong time.Time // the zero time: the first pass is a long one
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		since := time.Now().Add(-window)
		if reach > window && time.Since(lastLong) >= reach/4 {
			since, lastLong = time.Now().Add(-reach), time.Now()
		}
		report, err := r.Reconcile(ctx, since)
		t.Reset(interval)
		if err != nil && ctx.Err() == nil {
			r.log.ErrorContext(ctx, "reconcile: pass failed", "err", err)
			continue
		}
		r.log.DebugContext(ctx, "reconcile: pass done", "listed", report.Listed, "counts", report.Counts,
			"refunds_listed", report.RefundsListed, "refund_counts", report.RefundCounts)
	}
}
