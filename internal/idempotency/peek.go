package idempotency

import (
	"context"
	"errors"
	"fmt"

	"github.com/idempay/idempay/db"
)

// Peek tells, without claiming or writing anything, what Run would do with
// req now: OutcomeNew (no record), OutcomeReplayed, OutcomeMismatch,
// OutcomeConflict (in flight), OutcomeParked or OutcomeTakeover (resumable). An account in
// shadow mode uses it to count what enforcing idempotency would change.
// With no record, only the operation's ledger tells whether this same
// request ran before its record expired (Run: ErrKeyExpired, from Begin's
// insert): its caller asks it, as charges.Service.Peek does.
func (r *Runner) Peek(ctx context.Context, req Request) (Outcome, error) {
	if err := req.fingerprinted(); err != nil {
		return "", err
	}
	row, err := r.read(ctx, &req)
	switch {
	case errors.Is(err, db.ErrNotFound):
		return OutcomeNew, nil
	case errors.Is(err, ErrUnauthenticated):
		return "", err
	case err != nil:
		return "", fmt.Errorf("reading idempotency key: %w", err)
	default:
		return judge(&row, req, r.bounded(req.Method, req.Route)), nil
	}
}
