package charges

import (
	"bytes"
	"context"
	"fmt"

	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/idempotency"
)

// The service's entry points besides the HTTP API's own (chargeshttp): a
// charge sent as a broker message, and the rollout's shadow mode.

// CreateCharge is POST /v1/charges for an entry point that has the body as
// bytes (a broker message): the same front half, validation, record, ledger
// row and downstream key, so a charge made by message and one made over
// HTTP with the same account, key and body are the same charge (I9), and
// the second replays. body is the JSON of the HTTP request's body. Errors
// are the core's (*idempotency.Error), a validation problem (*Error), or
// the database's.
func (s *Service) CreateCharge(ctx context.Context, accountID, key string, body []byte) (idempotency.Response, error) {
	cmd, err := s.PrepareCharge(accountID, key, body)
	if err != nil {
		return idempotency.Response{}, err
	}
	return s.Run(ctx, cmd)
}

// PrepareCharge is CreateCharge's front half, which reads and writes
// nothing: the request validated and fingerprinted, ready for Run, or for
// Peek by an entry point that must know first whether a charge was ever
// started under the key (a broker message past its deliveries). Errors are
// CreateCharge's refusals.
func (s *Service) PrepareCharge(accountID, key string, body []byte) (*Command, error) {
	req, err := idempotency.PrepareBody(idempotency.AccountScope(accountID), key, methodPost, RouteCharges, RouteCharges,
		bytes.NewReader(body), idempotency.MaxBodyBytes)
	if err != nil {
		return nil, err
	}
	return s.NewCharge(accountID, req)
}

// CheckCharge refuses what PrepareCharge refuses, for a producer that
// checks a charge before sending it on (`idempay orders publish`): the
// front half reads and writes nothing, so a Service of no database checks
// as one of a database does.
func CheckCharge(accountID, key string, body []byte) error {
	_, err := new(Service).PrepareCharge(accountID, key, body)
	return err
}

// Peek tells, without claiming or writing anything, what Run would do with
// cmd: idempotency.Runner.Peek's answer, or for a key with no record
// OutcomeExpired when this same request's charge or refund exists (its
// record expired, and Run's claim refuses it: ErrKeyExpired). For a
// rollout's shadow mode, which counts what enforcing would change, and a
// broker message past its deliveries.
func (s *Service) Peek(ctx context.Context, cmd *Command) (idempotency.Outcome, error) {
	would, err := s.runner.Peek(ctx, cmd.Request)
	if err != nil || would != idempotency.OutcomeNew {
		return would, err
	}
	req := cmd.Request
	rec := &idempotency.Record{ID: idempotency.RecordID(req.Scope, req.Key, req.Fingerprint)}
	made, err := s.st.q.LedgerRowOfRecordExists(ctx, s.st.pool, &dbsqlc.LedgerRowOfRecordExistsParams{
		ChargeID: ledgerID("ch_", rec), RefundID: ledgerID("re_", rec)})
	switch {
	case err != nil:
		return "", fmt.Errorf("reading the ledger row of a key with no record: %w", err)
	case made:
		return idempotency.OutcomeExpired, nil
	}
	return idempotency.OutcomeNew, nil
}
