-- name: ChargeGetByIdempotencyKeyID :one
SELECT * FROM charges WHERE idempotency_key_id = @idempotency_key_id;

-- name: ChargeInsert :exec
-- The ledger row of a new charge, in the claim's batch after the record's
-- INSERT. Its id derives from the record's (ledgerID), so it exists only when
-- this same request ran before and its record has since expired: IDE01, and
-- nothing of the claim commits (docs/lifecycle.md, "A key reused after
-- retention"). ON CONFLICT (id) spares only the primary key: any other
-- violation still raises.
WITH c AS (
    INSERT INTO charges (id, account_id, idempotency_key_id, amount, currency, payment_method, description, metadata, capture_method)
    VALUES (@id, @account_id, @idempotency_key_id, @amount, @currency, @payment_method, @description, @metadata, @capture_method)
    ON CONFLICT (id) DO NOTHING
    RETURNING 1
)
SELECT idempay_expect((SELECT count(*) FROM c), 'IDE01', 'charge ' || @id::text);

-- name: ChargeSetOutcome :exec
-- The outcome of the Stripe call, in the finishing batch after the record's
-- fenced finish, guarded by the version loaded (IDS01: a Stripe event
-- changed the charge since).
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
