-- name: ChargeGetByID :one
SELECT * FROM charges WHERE account_id = @account_id AND id = @id;

-- name: ChargeGetByIdempotencyKeyID :one
SELECT * FROM charges WHERE idempotency_key_id = @idempotency_key_id;

-- name: ChargeList :many
-- Newest first. The cursor is the last charge of the previous page; a NULL
-- cursor starts at the newest.
SELECT * FROM charges
WHERE account_id = @account_id
  AND (sqlc.narg(cursor_created_at)::timestamptz IS NULL
       OR (created_at, id) < (sqlc.narg(cursor_created_at)::timestamptz, sqlc.narg(cursor_id)::text))
ORDER BY created_at DESC, id DESC
LIMIT @max_rows;

-- name: ChargeLockForRefund :exec
-- Locks the charge row, first in a refund's claim batch, so that concurrent
-- refunds of one charge (each with its own key) queue on the row instead of
-- failing a version guard one after another. Once the lock is held, the
-- next statement's snapshot sees every change committed to the charge
-- before it (other refunds, a dispute's ChargeTouch).
SELECT 1 FROM charges WHERE id = @id FOR NO KEY UPDATE;

-- name: ChargeReserveRefund :exec
-- Reserves a refund's amount on the charge, in the refund's claim batch,
-- after ChargeLockForRefund. Guarded by what a refund needs, checked on the
-- charge as it is now, not on the version the refund's checks read: the
-- charge succeeded, has no open or lost dispute, and still has the amount
-- left to refund. When one of them no longer holds it raises IDS01, and the
-- runner reads and checks again, which answers with what changed (for
-- example refund-exceeds-charge). The table's CHECK rejects any amount that
-- would exceed the charge whatever the checks said.
WITH c AS (
    UPDATE charges
    SET amount_refunded = amount_refunded + @amount, version = version + 1, updated_at = now()
    WHERE charges.id = @id
      AND charges.status = 'succeeded'
      AND charges.amount_captured - charges.amount_refunded >= @amount
      AND NOT EXISTS (SELECT 1 FROM disputes d
                      WHERE d.charge_id = charges.id AND d.status NOT IN ('won', 'warning_closed'))
    RETURNING 1
)
SELECT idempay_expect((SELECT count(*) FROM c), 'IDS01', 'the charge can no longer be refunded by this amount');

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

-- name: ChargeReleaseRefunded :exec
-- Releases a refund that failed at Stripe after it was reserved (or
-- succeeded). It never goes below zero: amount_refunded may have been raised
-- to Stripe's own figure by an event (ChargeApplyEvent).
UPDATE charges
SET amount_refunded = GREATEST(0, amount_refunded - @amount::bigint), version = version + 1, updated_at = now()
WHERE id = @id;

-- name: ChargeApplyEvent :exec
-- Applies a Stripe event's view of the charge, as the caller computed it
-- from the row at @version (states only move forward; amount_refunded only
-- grows, so an event applied late cannot undo a refund). Guarded: IDS01
-- when the charge changed since it was read.
WITH c AS (
    UPDATE charges
    SET status = @status,
        stripe_charge_id = sqlc.narg(stripe_charge_id),
        stripe_payment_intent_id = sqlc.narg(stripe_payment_intent_id),
        failure_code = sqlc.narg(failure_code),
        failure_message = sqlc.narg(failure_message),
        amount_refunded = @amount_refunded,
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

-- name: ChargeGet :one
-- A charge of any account, for operator commands (idempay webhooks trigger).
SELECT * FROM charges WHERE id = @id;

-- name: ChargeInsert :exec
-- The ledger row of a new charge, in the claim's batch after the record's
-- INSERT (version 1, processing). Its id is derived from the record's
-- (ledgerID), so it exists already only when this same key and request made
-- this charge before and its record has since expired: then it raises
-- IDE01 naming the charge, nothing of the claim commits, and the core
-- refuses the request (idempotency.ErrKeyExpired). ON CONFLICT (id) DO
-- NOTHING makes the primary key the check; any other violation still
-- raises as it is.
WITH c AS (
    INSERT INTO charges (id, account_id, idempotency_key_id, amount, currency, payment_method, description, metadata, capture_method)
    VALUES (@id, @account_id, @idempotency_key_id, @amount, @currency, @payment_method, @description, @metadata, @capture_method)
    ON CONFLICT (id) DO NOTHING
    RETURNING 1
)
SELECT idempay_expect((SELECT count(*) FROM c), 'IDE01', 'charge ' || @id::text);

-- name: ChargeSetOutcome :exec
-- The outcome of the Stripe call, in the finishing batch after the record's
-- fenced finish. Guarded by the version the owner loaded: IDS01 when
-- something else (a Stripe event) changed the charge in between.
WITH c AS (
    UPDATE charges
    SET status = @status,
        stripe_charge_id = @stripe_charge_id,
        stripe_payment_intent_id = @stripe_payment_intent_id,
        failure_code = @failure_code,
        failure_message = @failure_message,
        amount_capturable = @amount_capturable,
        amount_captured = @amount_captured,
        next_action_url = @next_action_url,
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

-- name: ChargeGetForRefund :one
-- What a refund checks, in one read before its claim: the charge, how many
-- of its disputes forbid a refund (open, or lost), and whether the refund's
-- own ledger row exists (the same request ran before its record expired:
-- RefundInsert refuses it, whatever the charge's state is now).
SELECT sqlc.embed(charges),
       (SELECT count(*) FROM disputes d
        WHERE d.charge_id = charges.id AND d.status NOT IN ('won', 'warning_closed')) AS blocking_disputes,
       EXISTS (SELECT 1 FROM refunds r WHERE r.id = @refund_id) AS refund_exists
FROM charges WHERE charges.account_id = @account_id AND charges.id = @id;

-- name: ChargeBeginPending :exec
-- Begins a capture or a cancel of the charge, in its claim batch. Guarded:
-- the charge must still be at the version whose checks passed (status,
-- nothing else pending), or it raises IDS01 and the runner reads and checks
-- again; so of a capture and a cancel racing, one begins and the other then
-- finds it pending.
WITH c AS (
    UPDATE charges
    SET pending_action = @pending_action, pending_record_id = @pending_record_id,
        pending_amount = sqlc.narg(pending_amount), version = version + 1, updated_at = now()
    WHERE id = @id AND version = @version AND pending_action IS NULL
    RETURNING 1
)
SELECT idempay_expect((SELECT count(*) FROM c), 'IDS01', 'the charge changed since it was read');

-- name: ChargeGetByPendingRecord :one
-- The charge of a capture or cancel in flight, by its idempotency record.
SELECT * FROM charges WHERE pending_record_id = @pending_record_id;

-- name: ChargeSettlePending :exec
-- The outcome of a capture or cancel, in its finishing batch: the charge's
-- new state, the pending action cleared. Guarded by the version the owner
-- read.
WITH c AS (
    UPDATE charges
    SET status = @status,
        stripe_charge_id = sqlc.narg(stripe_charge_id),
        amount_capturable = @amount_capturable,
        amount_captured = @amount_captured,
        next_action_url = NULL,
        pending_action = NULL, pending_record_id = NULL, pending_amount = NULL,
        version = version + 1,
        updated_at = now()
    WHERE id = @id AND version = @version
    RETURNING 1
)
SELECT idempay_expect((SELECT count(*) FROM c), 'IDS01', 'the charge changed since it was read');
