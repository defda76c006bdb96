-- name: DisputeGetByStripeID :one
SELECT * FROM disputes WHERE stripe_dispute_id = @stripe_dispute_id;

-- name: DisputeInsert :exec
-- A dispute first seen. Guarded: IDS01 when another event inserted it since
-- the read (the runner reads again and updates it instead).
WITH d AS (
    INSERT INTO disputes (account_id, charge_id, stripe_dispute_id, amount, currency, reason, status, allows_refund, last_event_at)
    VALUES (@account_id, @charge_id, @stripe_dispute_id, @amount, @currency, @reason, @status, @allows_refund, @last_event_at)
    ON CONFLICT (stripe_dispute_id) DO NOTHING
    RETURNING 1
)
SELECT idempay_expect((SELECT count(*) FROM d), 'IDS01', 'the dispute was inserted since it was read');

-- name: DisputeSetStatus :exec
-- Guarded by the state the caller read (status and last event time).
WITH d AS (
    UPDATE disputes
    SET status = @status, allows_refund = @allows_refund, amount = @amount, reason = @reason,
        last_event_at = @last_event_at, updated_at = now()
    WHERE id = @id AND status = @read_status AND last_event_at = @read_last_event_at
    RETURNING 1
)
SELECT idempay_expect((SELECT count(*) FROM d), 'IDS01', 'the dispute changed since it was read');

-- name: DisputeListByCharge :many
SELECT * FROM disputes WHERE charge_id = @charge_id ORDER BY created_at, id;
