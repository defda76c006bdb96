-- name: StripeEventInsert :exec
-- Records a verified event, in the claim's batch. A redelivery after the
-- idempotency record was purged finds the row already there and points it
-- at the new record.
INSERT INTO stripe_events (id, type, api_version, object_id, stripe_created, payload, idempotency_key_id)
VALUES (@id, @type, @api_version, @object_id, @stripe_created, @payload, @idempotency_key_id)
ON CONFLICT (id) DO UPDATE SET idempotency_key_id = COALESCE(stripe_events.idempotency_key_id, EXCLUDED.idempotency_key_id);

-- name: StripeEventGetByIdempotencyKeyID :one
SELECT * FROM stripe_events WHERE idempotency_key_id = @idempotency_key_id;

-- name: StripeEventGet :one
SELECT * FROM stripe_events WHERE id = @id;

-- name: StripeEventMarkProcessed :exec
-- The event's once-only guard, in the batch that changes the ledger: IDS01
-- when the event was processed since it was read. last_error is NULL, or for
-- the outcome failed the reason the event could not be applied.
WITH e AS (
    UPDATE stripe_events
    SET processed_at = now(), outcome = @outcome, attempts = attempts + 1, last_error = sqlc.narg(last_error)
    WHERE id = @id AND processed_at IS NULL
    RETURNING 1
)
SELECT idempay_expect((SELECT count(*) FROM e), 'IDS01', 'the event was processed since it was read');

-- name: StripeEventRecordFailure :exec
UPDATE stripe_events
SET attempts = attempts + 1, last_error = @last_error
WHERE id = @id AND processed_at IS NULL;
