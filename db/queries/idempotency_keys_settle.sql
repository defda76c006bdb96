-- name: IdempotencyKeySettle :exec
-- Finishes a record from outside its own lifecycle, inside the caller's
-- batch (a webhook, or reconciliation, that learns the outcome of a charge
-- whose finishing commit never happened): the one way a parked record
-- finishes. It takes the record over (generation + 1), so a stale owner that
-- wakes up later is fenced, and it matches no row when the record is already
-- finished.
UPDATE idempotency_keys
SET recovery_point = 'finished',
    response_status = @response_status,
    response_headers = @response_headers,
    response_body = @response_body,
    lock_generation = lock_generation + 1,
    locked_at = NULL,
    last_error = NULL,
    finished_at = now(),
    updated_at = now()
WHERE id = @id
  AND recovery_point <> 'finished';
