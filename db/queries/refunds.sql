-- name: RefundInsert :one
INSERT INTO refunds (account_id, idempotency_key_id, charge_id, amount)
VALUES (@account_id, @idempotency_key_id, @charge_id, @amount)
RETURNING *;

-- name: RefundGetByID :one
SELECT * FROM refunds WHERE account_id = @account_id AND id = @id;

-- name: RefundGetByIdempotencyKeyID :one
SELECT * FROM refunds WHERE idempotency_key_id = @idempotency_key_id;

-- name: RefundSetOutcome :one
UPDATE refunds
SET status = @status,
    stripe_refund_id = @stripe_refund_id,
    failure_code = @failure_code,
    failure_message = @failure_message,
    updated_at = now()
WHERE id = @id
RETURNING *;

-- name: RefundFindForEvent :one
-- The refund a Stripe event is about; see ChargeFindForEvent.
SELECT id FROM refunds
WHERE idempotency_key_id = sqlc.narg(record_id)
   OR id = sqlc.narg(refund_id)
   OR stripe_refund_id = sqlc.narg(stripe_refund_id)
LIMIT 1;

-- name: RefundGetForUpdate :one
SELECT * FROM refunds WHERE id = @id FOR UPDATE;

-- name: RefundApplyEvent :one
UPDATE refunds
SET status = @status,
    stripe_refund_id = COALESCE(stripe_refund_id, sqlc.narg(stripe_refund_id)),
    failure_code = COALESCE(sqlc.narg(failure_code), failure_code),
    last_event_at = GREATEST(last_event_at, @event_created::timestamptz),
    updated_at = now()
WHERE id = @id
RETURNING *;

-- name: RefundGet :one
-- A refund of any account, for operator commands (idempay webhooks trigger).
SELECT * FROM refunds WHERE id = @id;
