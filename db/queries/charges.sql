-- name: ChargeGetByIdempotencyKeyID :one
SELECT * FROM charges WHERE idempotency_key_id = @idempotency_key_id;

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
