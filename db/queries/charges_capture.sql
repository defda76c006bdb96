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
