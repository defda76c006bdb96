-- name: DisputeGetByStripeIDForUpdate :one
SELECT * FROM disputes WHERE stripe_dispute_id = @stripe_dispute_id FOR UPDATE;

-- name: DisputeInsert :one
INSERT INTO disputes (account_id, charge_id, stripe_dispute_id, amount, currency, reason, status, last_event_at)
VALUES (@account_id, @charge_id, @stripe_dispute_id, @amount, @currency, @reason, @status, @last_event_at)
RETURNING *;

-- name: DisputeSetStatus :exec
UPDATE disputes
SET status = @status, amount = @amount, reason = @reason, last_event_at = @last_event_at, updated_at = now()
WHERE id = @id;

-- name: DisputeListByCharge :many
SELECT * FROM disputes WHERE charge_id = @charge_id ORDER BY created_at, id;

-- name: DisputeCountBlockingRefund :one
-- Disputes that forbid a refund: open, or lost.
SELECT count(*) FROM disputes
WHERE charge_id = @charge_id AND status NOT IN ('won', 'warning_closed');
