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

-- name: ChargeFindForEvent :one
-- The charge a Stripe event is about: by the idempotency record or the
-- charge id that idempay put in the charge's metadata, or by Stripe's id.
-- Events carry no account: the account comes from the row.
SELECT id FROM charges
WHERE idempotency_key_id = sqlc.narg(record_id)
   OR id = sqlc.narg(charge_id)
   OR stripe_charge_id = sqlc.narg(stripe_charge_id)
LIMIT 1;

-- name: ChargeGetForUpdate :one
SELECT * FROM charges WHERE id = @id FOR UPDATE;

-- name: ChargeReleaseRefunded :exec
-- Releases a refund that failed at Stripe after it was reserved (or
-- succeeded). It never goes below zero: amount_refunded may have been raised
-- to Stripe's own figure by an event (ChargeApplyEvent).
UPDATE charges
SET amount_refunded = GREATEST(0, amount_refunded - @amount::bigint), updated_at = now()
WHERE id = @id;

-- name: ChargeApplyEvent :one
-- Applies a Stripe event's view of the charge. The caller decides that the
-- status moves forward; amount_refunded only ever grows here (the larger of
-- ours, which counts refunds in flight, and Stripe's), so an event applied
-- late cannot undo a refund.
UPDATE charges
SET status = @status,
    stripe_charge_id = COALESCE(stripe_charge_id, sqlc.narg(stripe_charge_id)),
    failure_code = COALESCE(sqlc.narg(failure_code), failure_code),
    failure_message = COALESCE(sqlc.narg(failure_message), failure_message),
    amount_refunded = LEAST(amount, GREATEST(amount_refunded, @stripe_amount_refunded::bigint)),
    last_event_at = GREATEST(last_event_at, @event_created::timestamptz),
    updated_at = now()
WHERE id = @id
RETURNING *;

-- name: ChargeGet :one
-- A charge of any account, for operator commands (idempay webhooks trigger).
SELECT * FROM charges WHERE id = @id;
