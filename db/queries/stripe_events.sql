-- name: StripeEventInsert :one
-- Records a verified event. A redelivery after the idempotency record was
-- purged finds the row already there and returns it as it is.
INSERT INTO stripe_events (id, type, api_version, object_id, stripe_created, payload, idempotency_key_id)
VALUES (@id, @type, @api_version, @object_id, @stripe_created, @payload, @idempotency_key_id)
ON CONFLICT (id) DO UPDATE SET idempotency_key_id = COALESCE(stripe_events.idempotency_key_id, EXCLUDED.idempotency_key_id)
RETURNING *;

-- name: StripeEventGetByIdempotencyKeyID :one
SELECT * FROM stripe_events WHERE idempotency_key_id = @idempotency_key_id;

-- name: StripeEventGetForUpdate :one
-- Locks the event's row for the transaction that applies it.
SELECT * FROM stripe_events WHERE id = @id FOR UPDATE;

-- name: StripeEventMarkProcessed :execrows
-- The event's once-only guard, in the transaction that changes the ledger:
-- it matches no row when the event was processed already.
UPDATE stripe_events
SET processed_at = now(), outcome = @outcome, attempts = attempts + 1, last_error = NULL
WHERE id = @id AND processed_at IS NULL;

-- name: StripeEventRecordFailure :exec
UPDATE stripe_events
SET attempts = attempts + 1, last_error = @last_error
WHERE id = @id AND processed_at IS NULL;
