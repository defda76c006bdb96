package charges

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/listing"
)

// ChargeDetail is a charge as GET /v1/charges/{id} shows it: with its
// disputes, which only Stripe's events make known.
type ChargeDetail struct {
	Charge
	Disputes []Dispute `json:"disputes"`
}

// Dispute is the API representation of a dispute of a charge.
type Dispute struct {
	ID              string  `json:"id"`
	Object          string  `json:"object"`
	StripeDisputeID string  `json:"stripe_dispute_id"`
	Amount          int64   `json:"amount"`
	Currency        string  `json:"currency"`
	Reason          *string `json:"reason"`
	Status          string  `json:"status"`
	// AllowsRefund is whether the dispute lets a refund of its charge
	// through: its status does (no open or lost chargeback) and so does
	// Stripe (is_charge_refundable). A false one is why POST /v1/refunds
	// answers 409 charge-not-refundable.
	AllowsRefund bool      `json:"allows_refund"`
	CreatedAt    time.Time `json:"created_at"`
	UpdatedAt    time.Time `json:"updated_at"`
}

// Charge is GET /v1/charges/{id}: the account's charge with its disputes.
// Another account's charge is not found, like an unknown one (I5).
func (s *Service) Charge(ctx context.Context, accountID, id string) (ChargeDetail, error) {
	ch, err := s.st.charge(ctx, accountID, id)
	if err := readErr(err, "charge"); err != nil {
		return ChargeDetail{}, err
	}
	rows, err := s.st.disputesOf(ctx, ch.ID)
	if err != nil {
		return ChargeDetail{}, fmt.Errorf("reading disputes: %w", err)
	}
	out := ChargeDetail{Charge: chargeJSON(ch), Disputes: make([]Dispute, 0, len(rows))}
	for _, d := range rows {
		out.Disputes = append(out.Disputes, Dispute{ID: d.ID, Object: "dispute", StripeDisputeID: d.StripeDisputeID,
			Amount: d.Amount, Currency: d.Currency, Reason: d.Reason, Status: d.Status, AllowsRefund: d.AllowsRefund,
			CreatedAt: d.CreatedAt.UTC(), UpdatedAt: d.UpdatedAt.UTC()})
	}
	return out, nil
}

// ChargeList is one page of charges, newest first.
type ChargeList = listing.List[Charge]

// Charges is GET /v1/charges: one page of at most limit of the account's
// charges, newest first, after the charge startingAfter when it is not "".
func (s *Service) Charges(ctx context.Context, accountID string, limit int, startingAfter string) (ChargeList, error) {
	var cursor *chargeRow
	if startingAfter != "" {
		cur, err := s.st.charge(ctx, accountID, startingAfter)
		if errors.Is(err, ErrNotFound) {
			return ChargeList{}, invalid(InvalidParam{Name: "starting_after", Reason: "is not a charge of this account"})
		} else if err != nil {
			return ChargeList{}, fmt.Errorf("reading cursor charge: %w", err)
		}
		cursor = &cur
	}
	rows, err := s.st.charges(ctx, accountID, int32(limit+1), cursor)
	if err != nil {
		return ChargeList{}, fmt.Errorf("listing charges: %w", err)
	}
	return listing.Page(rows, limit, chargeJSON), nil
}

// Refund is GET /v1/refunds/{id}: the account's refund. Another account's
// refund is not found, like an unknown one (I5).
func (s *Service) Refund(ctx context.Context, accountID, id string) (Refund, error) {
	rf, err := s.st.refund(ctx, accountID, id)
	if err := readErr(err, "refund"); err != nil {
		return Refund{}, err
	}
	return refundJSON(rf), nil
}

// readErr maps a read's error: not found (including another account's
// object, which this account must not learn exists) is a refusal of kind
// ErrNotFound.
func readErr(err error, object string) error {
	if errors.Is(err, ErrNotFound) {
		return refuse(ErrNotFound, fmt.Sprintf("No such %s.", object))
	}
	if err != nil {
		return fmt.Errorf("reading %s: %w", object, err)
	}
	return nil
}

func (st store) charge(ctx context.Context, accountID, id string) (chargeRow, error) {
	ch, err := found(st.q.ChargeGetByID(ctx, st.pool, &dbsqlc.ChargeGetByIDParams{AccountID: accountID, ID: id}))
	return chargeRow(ch), err
}

// charges is one page of at most max of the account's charges, newest
// first, after the charge cursor if it is not nil.
func (st store) charges(ctx context.Context, accountID string, max int32, cursor *chargeRow) ([]chargeRow, error) {
	params := &dbsqlc.ChargeListParams{AccountID: accountID, MaxRows: max}
	if cursor != nil {
		params.CursorCreatedAt, params.CursorID = &cursor.CreatedAt, &cursor.ID
	}
	rows, err := st.q.ChargeList(ctx, st.pool, params)
	out := make([]chargeRow, len(rows))
	for i, r := range rows {
		out[i] = chargeRow(r)
	}
	return out, err
}

func (st store) refund(ctx context.Context, accountID, id string) (refundRow, error) {
	rf, err := found(st.q.RefundGetByID(ctx, st.pool, &dbsqlc.RefundGetByIDParams{AccountID: accountID, ID: id}))
	return refundRow(rf), err
}

func (st store) disputesOf(ctx context.Context, chargeID string) ([]disputeRow, error) {
	rows, err := st.q.DisputeListByCharge(ctx, st.pool, chargeID)
	out := make([]disputeRow, len(rows))
	for i, d := range rows {
		out[i] = disputeRow(d)
	}
	return out, err
}
