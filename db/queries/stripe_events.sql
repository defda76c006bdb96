-- name: StripeEventInsert :exec
-- Records a verified event, in the claim's batch. The event id is the key,
-- so the row exists already only when the event was received before and its
-- record has since expired; that record finished, and so applied the event
-- (its finish marks the row processed), since retention never deletes an
-- unfinished record. Then it raises IDE01 naming the event, nothing of the
-- claim commits, and the core refuses the delivery
-- (idempotency.ErrKeyExpired), which the endpoint acknowledges.
WITH e AS (
    INSERT INTO stripe_events (id, type, api_version, object_id, stripe_created, payload, idempotency_key_id)
    VALUES (@id, @type, @api_version, @object_id, @stripe_created, @payload, @idempotency_key_id)
    ON CONFLICT (id) DO NOTHING
    RETURNING 1
)
SELECT idempay_expect((SELECT count(*) FROM e), 'IDE01', 'Stripe event ' || @id::text);

-- name: StripeEventGetByIdempotencyKeyID :one
SELECT * FROM stripe_events WHERE idempotency_key_id = @idempotency_key_id;

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
