-- name: ChargeFindForEvent :one
-- The charge a Stripe event is about: by Stripe's PaymentIntent or charge
-- id (each through its partial index), or by the idempotency record that
-- idempay put in the PaymentIntent's metadata (a charge whose finishing
-- commit never happened has no Stripe id yet). Events carry no account:
-- the account comes from the row. Read without a lock: the writes that
-- follow are guarded by the version read here.
SELECT * FROM charges
WHERE stripe_payment_intent_id = sqlc.narg(stripe_payment_intent_id)
   OR stripe_charge_id = sqlc.narg(stripe_charge_id)
   OR idempotency_key_id = sqlc.narg(record_id)
ORDER BY stripe_payment_intent_id = sqlc.narg(stripe_payment_intent_id) DESC NULLS LAST,
         stripe_charge_id = sqlc.narg(stripe_charge_id) DESC NULLS LAST
LIMIT 1;

-- name: ChargeApplyEvent :exec
-- Applies a Stripe event's view of the charge, as the caller computed it
-- from the row at @version (states only move forward; Stripe's figure of
-- what was refunded is a newer event's, by stripe_refunded_at). Guarded:
-- IDS01 when the charge changed since it was read.
WITH c AS (
    UPDATE charges
    SET status = @status,
        stripe_charge_id = sqlc.narg(stripe_charge_id),
        stripe_payment_intent_id = sqlc.narg(stripe_payment_intent_id),
        failure_code = sqlc.narg(failure_code),
        failure_message = sqlc.narg(failure_message),
        amount_refunded = @amount_refunded,
        stripe_amount_refunded = @stripe_amount_refunded,
        stripe_refunded_at = sqlc.narg(stripe_refunded_at),
        amount_capturable = @amount_capturable,
        amount_captured = @amount_captured,
        next_action_url = sqlc.narg(next_action_url),
        pending_action = sqlc.narg(pending_action),
        pending_record_id = sqlc.narg(pending_record_id),
        pending_amount = sqlc.narg(pending_amount),
        last_event_at = @last_event_at,
        version = version + 1,
        updated_at = now()
    WHERE id = @id AND version = @version
    RETURNING 1
)
SELECT idempay_expect((SELECT count(*) FROM c), 'IDS01', 'the charge changed since it was read');

-- name: ChargeTouch :exec
-- Bumps the charge's version without changing it otherwise, guarded by the
-- version read: a dispute's event does, so that it holds the charge row's
-- lock until its dispute commits, and a refund, which takes that lock
-- first (ChargeLockForRefund), waits for the dispute and then sees it.
WITH c AS (
    UPDATE charges SET version = version + 1, updated_at = now()
    WHERE id = @id AND version = @version
    RETURNING 1
)
SELECT idempay_expect((SELECT count(*) FROM c), 'IDS01', 'the charge changed since it was read');
