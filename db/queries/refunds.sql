-- name: RefundInsert :exec
-- The ledger row of a new refund, in the claim's batch (version 1); its id
-- is derived from the record's, and a second insert of it raises IDE01
-- naming the refund, as a charge's does (ChargeInsert).
WITH r AS (
    INSERT INTO refunds (id, account_id, idempotency_key_id, charge_id, amount)
    VALUES (@id, @account_id, @idempotency_key_id, @charge_id, @amount)
    ON CONFLICT (id) DO NOTHING
    RETURNING 1
)
SELECT idempay_expect((SELECT count(*) FROM r), 'IDE01', 'refund ' || @id::text);

-- name: RefundGetByID :one
SELECT * FROM refunds WHERE account_id = @account_id AND id = @id;

-- name: RefundGetByIdempotencyKeyID :one
SELECT * FROM refunds WHERE idempotency_key_id = @idempotency_key_id;

-- name: RefundSetOutcome :exec
-- The outcome of the Stripe call; guarded like ChargeSetOutcome.
WITH r AS (
    UPDATE refunds
    SET status = @status,
        stripe_refund_id = @stripe_refund_id,
        failure_code = @failure_code,
        failure_message = @failure_message,
        version = version + 1,
        updated_at = now()
    WHERE id = @id AND version = @version
    RETURNING 1
)
SELECT idempay_expect((SELECT count(*) FROM r), 'IDS01', 'the refund changed since it was read');

-- name: RefundFindForEvent :one
-- The refund a Stripe event is about; see ChargeFindForEvent.
SELECT * FROM refunds
WHERE stripe_refund_id = sqlc.narg(stripe_refund_id)
   OR idempotency_key_id = sqlc.narg(record_id)
ORDER BY stripe_refund_id = sqlc.narg(stripe_refund_id) DESC NULLS LAST
LIMIT 1;

-- name: RefundApplyEvent :exec
-- Applies a Stripe event's view of the refund, computed from the row at
-- @version; guarded like ChargeApplyEvent.
WITH r AS (
    UPDATE refunds
    SET status = @status,
        stripe_refund_id = sqlc.narg(stripe_refund_id),
        failure_code = sqlc.narg(failure_code),
        last_event_at = @last_event_at,
        version = version + 1,
        updated_at = now()
    WHERE id = @id AND version = @version
    RETURNING 1
)
SELECT idempay_expect((SELECT count(*) FROM r), 'IDS01', 'the refund changed since it was read');

-- name: RefundGet :one
-- A refund of any account, for operator commands (idempay webhooks trigger).
SELECT * FROM refunds WHERE id = @id;
