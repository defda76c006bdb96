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
