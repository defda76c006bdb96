package idempotency

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/idempay/idempay/internal/dbsqlc"
)

// Register tells the completer how to resume records of one operation:
// resume returns an Operation that Loads its state from the ledger. The
// operation calls downstream under a key the downstream forgets, so its
// records are parked past the retry ceiling (RegisterLocal is for those
// that call no one).
func (r *Runner) Register(method, route string, resume func() Operation) {
	r.resumers[method+" "+route] = resume
}

// RegisterLocal is Register for an operation that calls no one outside the
// database (a Stripe event applied to the ledger, an API key created): a
// retry of it is safe at any age, so its records are never parked.
func (r *Runner) RegisterLocal(method, route string, resume func() Operation) {
	r.Register(method, route, resume)
	r.local[method+" "+route] = true
}

// CompleteDue runs one completer pass: it parks the records past the retry
// ceiling (ParkDue), then takes over the unfinished records whose lock has
// expired (the owner crashed, or gave up after an unknown outcome), that are
// due and under the ceiling, and completes each as Run does once it owns a
// record (load, call, finish), with the same downstream key. It returns how
// many it finished. Several processes may run it at once: the claim uses
// SKIP LOCKED and a new lock generation, so each record has one owner.
func (r *Runner) CompleteDue(ctx context.Context) (int, error) {
	if len(r.resumers) == 0 {
		return 0, nil
	}
	if _, err := r.ParkDue(ctx); err != nil {
		return 0, err
	}
	routes := make([]string, 0, len(r.resumers))
	for route := range r.resumers {
		routes = append(routes, route)
	}
	rows, err := r.q.IdempotencyKeyClaimExpired(ctx, r.pool, &dbsqlc.IdempotencyKeyClaimExpiredParams{
		Routes:              routes,
		LockTimeoutSeconds:  r.cfg.LockTimeout.Seconds(),
		RetryCeilingSeconds: r.cfg.RetryCeiling.Seconds(),
		CeilingRoutes:       r.ceilingRoutes(),
		MaxRecords:          r.cfg.CompleterBatch,
		Now:                 r.now(),
	})
	if err != nil {
		return 0, fmt.Errorf("claiming expired idempotency records: %w", err)
	}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		finished int
	)
	for _, row := range rows {
		rec := recordOf(row)
		log := r.log.With("idempotency_key_id", rec.ID)
		resume := r.resumers[rec.Method+" "+rec.Route] // the claim only returns registered routes
		wg.Add(1)
		go func() {
			defer wg.Done()
			// One trace per resumption, its call and finish under a span
			// with the record's attributes, as a request's are under its
			// server span.
			cctx, end := r.span(context.WithoutCancel(ctx), "idempotency.complete")
			resp, err := r.complete(cctx, rec, resume())
			r.annotate(cctx, Request{Scope: rec.Scope, Key: rec.Key}, rec, "", err)
			end(err)
			if err != nil {
				log.WarnContext(ctx, "completer: record not finished yet",
					"attempts", rec.Attempts+1, "err", err)
				return
			}
			r.observe(OutcomeRecovered)
			log.InfoContext(ctx, "completer: finished record",
				"account_id", rec.Scope.AccountID(),
				"recovery_point", rec.RecoveryPoint, "status", resp.Status)
			mu.Lock()
			finished++
			mu.Unlock()
		}()
	}
	wg.Wait()
	return finished, nil
}

// RunCompleter calls CompleteDue every interval until ctx is done.
func (r *Runner) RunCompleter(ctx context.Context, interval time.Duration) {
	r.log.InfoContext(ctx, "completer started", "interval", interval.String(), "lock_timeout", r.cfg.LockTimeout.String(),
		"retry_ceiling", r.cfg.RetryCeiling.String())
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if _, err := r.CompleteDue(ctx); err != nil && ctx.Err() == nil {
			r.log.ErrorContext(ctx, "completer pass failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// LocalRoutes are the routes of RegisterLocal, as "METHOD route": their
// records are never parked (the console tells parked records by them).
func (r *Runner) LocalRoutes() []string {
	routes := make([]string, 0, len(r.local))
	for route := range r.local {
		routes = append(routes, route)
	}
	return routes
}

// ceilingRoutes are the registered routes whose records are parked past the
// ceiling, as the completer's queries name them.
func (r *Runner) ceilingRoutes() []string {
	routes := make([]string, 0, len(r.resumers))
	for route := range r.resumers {
		if !r.local[route] {
			routes = append(routes, route)
		}
	}
	return routes
}

// ParkDue parks up to CompleterBatch unfinished records of the routes under
// the ceiling that are older than Config.RetryCeiling and whose lock is free
// or expired, and returns how many it parked. CompleteDue calls it first;
// several processes may run it at once (SKIP LOCKED).
func (r *Runner) ParkDue(ctx context.Context) (int, error) {
	routes := r.ceilingRoutes()
	if len(routes) == 0 {
		return 0, nil
	}
	rows, err := r.q.IdempotencyKeyParkExpired(ctx, r.pool, &dbsqlc.IdempotencyKeyParkExpiredParams{
		Now: r.now(), RetryCeilingSeconds: r.cfg.RetryCeiling.Seconds(), CeilingRoutes: routes,
		LockTimeoutSeconds: r.cfg.LockTimeout.Seconds(), MaxRecords: r.cfg.CompleterBatch,
	})
	if err != nil {
		return 0, fmt.Errorf("parking idempotency records past the retry ceiling: %w", err)
	}
	for _, row := range rows {
		r.observe(OutcomeParked)
		r.log.WarnContext(ctx, "completer: parked an unfinished record past the retry ceiling; Stripe's events and reconciliation settle it",
			"idempotency_key_id", row.ID, "route", row.RequestMethod+" "+row.RequestRoute,
			"attempts", row.Attempts, "created_at", row.CreatedAt, "retry_ceiling", r.cfg.RetryCeiling.String())
	}
	return len(rows), nil
}
