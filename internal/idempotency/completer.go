package idempotency

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/idempay/idempay/internal/dbsqlc"
)

// CompleteDue runs one completer pass: it parks the records past the retry
// ceiling (ParkDue), then takes over the unfinished records whose lock has
// expired (the owner crashed, or gave up after an unknown outcome), that are
// due and under the ceiling, and completes each as Run does once it owns a
// record (load, call, finish), with the same downstream key. It returns how many it finished. Several processes may run
// it at once: the claim uses SKIP LOCKED and a new lock generation, so each
// record has one owner.
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
			resp, err := r.complete(context.WithoutCancel(ctx), rec, resume())
			if err != nil {
				log.WarnContext(ctx, "completer: record not finished yet",
					"attempts", rec.Attempts+1, "err", err)
				return
			}
			r.observe(OutcomeRecovered)
			log.InfoContext(ctx, "completer: finished record",
				"account_id", rec.AccountID,
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
