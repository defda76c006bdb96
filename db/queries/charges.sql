-- name: ChargeInsert :one
INSERT INTO charges (
    account_id, idempotency_key_id, amount, currency, payment_method, description, metadata
) VALUES (
    @account_id, @idempotency_key_id, @amount, @currency, @payment_method, @description, @metadata
)
RETURNING *;

-- name: ChargeGetByID :one
SELECT * FROM charges WHERE account_id = @account_id AND id = @id;

-- name: ChargeGetByIdempotencyKeyID :one
SELECT * FROM charges WHERE idempotency_key_id = @idempotency_key_id;

-- name: ChargeGetByIDForUpdate :one
SELECT * FROM charges WHERE account_id = @account_id AND id = @id FOR UPDATE;

-- name: ChargeList :many
-- Newest first. The cursor is the last charge of the previous page; a NULL
-- cursor starts at the newest.
SELECT * FROM charges
WHERE account_id = @account_id
  AND (sqlc.narg(cursor_created_at)::timestamptz IS NULL
       OR (created_at, id) < (sqlc.narg(cursor_created_at)::timestamptz, sqlc.narg(cursor_id)::text))
ORDER BY created_at DESC, id DESC
LIMIT @max_rows;

-- name: ChargeSetOutcome :one
UPDATE charges
SET status = @status,
    stripe_charge_id = @stripe_charge_id,
    failure_code = @failure_code,
    failure_message = @failure_message,
    updated_at = now()
WHERE id = @id
RETURNING *;

-- name: ChargeAddRefunded :exec
-- Reserves (positive delta) or releases (negative delta) refunded amount; the
-- table's CHECK rejects any change that would exceed the charge.
UPDATE charges
SET amount_refunded = amount_refunded + @delta, updated_at = now()
WHERE id = @id;
