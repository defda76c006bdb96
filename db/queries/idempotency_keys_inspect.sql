-- name: IdempotencyKeyInspect :one
-- One account's record with the id of the ledger row it created, for GET
-- /v1/idempotency_keys/{key}: the charge of a charge's record; the refund of
-- a refund's record, and the charge it refunds; the charge of a capture or
-- cancel in flight (its pending_record_id). It selects the state, and the
-- stored response body (never shown) of a record of the acted_on_routes
-- alone, a capture's or a cancel's (NULL for any other): charges.ActedOn
-- reads it for the charge that its answer names, which the ledger no longer
-- links once it has finished. Never the headers, nor the fingerprint.
SELECT ik.id, ik.key, ik.request_method, ik.request_route, ik.recovery_point,
       ik.lock_generation, ik.locked_at, ik.attempts, ik.next_attempt_at,
       ik.last_error, ik.response_status, ik.created_at, ik.updated_at,
       ik.finished_at,
       (CASE WHEN ik.request_route = ANY (@acted_on_routes::text[]) THEN ik.response_body END)::bytea AS response_body,
       c.id AS charge_id,
       r.id AS refund_id,
       r.charge_id AS refund_charge_id,
       p.id AS pending_charge_id
FROM idempotency_keys ik
LEFT JOIN charges c ON c.idempotency_key_id = ik.id
LEFT JOIN refunds r ON r.idempotency_key_id = ik.id
LEFT JOIN charges p ON p.pending_record_id = ik.id
WHERE ik.scope = @scope AND ik.key = @key;
