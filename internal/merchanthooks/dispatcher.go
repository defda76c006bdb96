package merchanthooks

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/dbsqlc"
)

// Dispatch runs one dispatcher pass and returns how many events it fanned
// out (whether or not an endpoint wanted them). In one transaction, which
// holds the dispatcher's row lock (one pass at a time, in any number of
// processes): the gaps earlier passes kept are stamped with this pass's
// transaction id; the committed events after the position are read in seq
// order and fanned out, every seq skipped below the last of them is kept
// as a gap, and the position moves to the last of them; then the gaps that
// are settled are fanned out and forgotten (WebhookDispatchGapsResolve).
// The gaps come second, in a later snapshot than the read: an event read
// here was committed before the read, and so was every earlier event of
// its object (an object's events commit one after the other), which a
// gap's resolution therefore sees. So the deliveries of one object's events
// are created by one pass, or in order, and a worker never finds a later
// version without the earlier one. The fan-out is an INSERT ... ON CONFLICT
// DO NOTHING on (event, endpoint): a pass repeated after a crash creates
// nothing twice. It runs off the request path, and reads the events table
// only. Once it holds the dispatcher's row (which it waits for without
// bound: only passes take it, each short), the pass waits for any other
// row lock at most RowLockWait (Runner.LimitLockWait): an endpoint's row
// that another transaction holds and does not end (an operator's) blocks
// the fan-out's FOR SHARE, and a pass waiting for it would keep the
// endpoints it has locked from the workers' recordings for as long. Past
// the wait nothing of the pass commits, and the next pass, after
// Interval, tries again.
func (s *Service) Dispatch(ctx context.Context) (int64, error) {
	return db.WithTx(ctx, s.pool, func(ctx context.Context, tx pgx.Tx) (int64, error) {
		last, err := s.q.WebhookDispatcherLock(ctx, tx)
		if err != nil {
			return 0, fmt.Errorf("locking the dispatcher: %w", err)
		}
		if err := s.runner.LimitLockWait(ctx, tx); err != nil {
			return 0, fmt.Errorf("bounding the pass's lock waits: %w", err)
		}
		// Before this pass keeps gaps of its own (WebhookDispatchGapsStamp).
		if err := s.q.WebhookDispatchGapsStamp(ctx, tx); err != nil {
			return 0, fmt.Errorf("stamping dispatch gaps: %w", err)
		}
		rows, err := s.q.WebhookDispatcherRead(ctx, tx, &dbsqlc.WebhookDispatcherReadParams{AfterSeq: &last, MaxRows: s.cfg.Batch})
		if err != nil {
			return 0, fmt.Errorf("reading events: %w", err)
		}
		seqs := make([]int64, 0, len(rows))
		var gaps []int64
		next := last + 1
		for _, r := range rows {
			seq := *r
			for ; next < seq; next++ {
				gaps = append(gaps, next)
			}
			seqs = append(seqs, seq)
			next = seq + 1
		}
		if err := s.fanOut(ctx, tx, seqs); err != nil {
			return 0, err
		}
		if len(gaps) > 0 {
			if err := s.q.WebhookDispatchGapsAdd(ctx, tx, gaps); err != nil {
				return 0, fmt.Errorf("keeping dispatch gaps: %w", err)
			}
		}
		if len(seqs) > 0 {
			if err := s.q.WebhookDispatcherAdvance(ctx, tx, seqs[len(seqs)-1]); err != nil {
				return 0, fmt.Errorf("moving the dispatcher: %w", err)
			}
		}
		resolved, err := s.q.WebhookDispatchGapsResolve(ctx, tx)
		if err != nil {
			return 0, fmt.Errorf("resolving dispatch gaps: %w", err)
		}
		if err := s.fanOut(ctx, tx, resolved); err != nil {
			return 0, err
		}
		return int64(len(seqs) + len(resolved)), nil
	})
}

func (s *Service) fanOut(ctx context.Context, tx pgx.Tx, seqs []int64) error {
	if len(seqs) == 0 {
		return nil
	}
	lo, hi := seqs[0], seqs[0]
	for _, q := range seqs {
		lo, hi = min(lo, q), max(hi, q)
	}
	if _, err := s.q.WebhookDeliveriesFanOut(ctx, tx, &dbsqlc.WebhookDeliveriesFanOutParams{Lo: lo, Hi: hi, Seqs: seqs, Now: s.cfg.dbNow()}); err != nil {
		return fmt.Errorf("creating deliveries: %w", err)
	}
	return nil
}

// RunDispatcher dispatches until ctx is done, pausing Config.Interval
// after a pass that was not a full batch (it caught up): at a steady load,
// one pass every Interval fans out every event committed meanwhile.
func (s *Service) RunDispatcher(ctx context.Context) {
	for ctx.Err() == nil {
		n, err := s.Dispatch(ctx)
		if err != nil && ctx.Err() == nil {
			s.log.WarnContext(ctx, "webhooks out: dispatch pass failed; retrying", "err", err)
		}
		if n < int64(s.cfg.Batch) || err != nil {
			if !sleep(ctx, s.cfg.Interval) {
				return
			}
		}
	}
}

// sleep waits d or until ctx is done; it returns false when ctx is done.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
