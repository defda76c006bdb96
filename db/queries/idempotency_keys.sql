-- name: IdempotencyKeyClaim :one
-- Claims (scope, key) in one statement. A new key is inserted with
-- lock_generation 1. An existing key is taken over (generation + 1) only when
-- it is unfinished, its fingerprint matches, and its lock is free or older
-- than the lock timeout. Otherwise no row is returned and the caller reads
-- the record to tell replay, mismatch and in-flight apart.
INSERT INTO idempotency_keys (
    scope, account_id, key, request_method, request_route, request_fingerprint, locked_at
) VALUES (
    @scope, sqlc.narg(account_id), @key, @request_method, @request_route, @request_fingerprint, now()
)
ON CONFLICT (scope, key) DO UPDATE
SET locked_at = now(),
    lock_generation = idempotency_keys.lock_generation + 1,
    updated_at = now()
WHERE idempotency_keys.recovery_point <> 'finished'
  -- A version-1 record is compared with the request's version-1
  -- fingerprint (NULL when the caller did not compute one: no match).
  AND CASE WHEN idempotency_keys.fingerprint_version = 1
           THEN idempotency_keys.request_fingerprint = sqlc.narg(legacy_fingerprint)::bytea
           ELSE idempotency_keys.request_fingerprint = EXCLUDED.request_fingerprint END
  AND (idempotency_keys.locked_at IS NULL
       OR idempotency_keys.locked_at < now() - make_interval(secs => @lock_timeout_seconds::float8))
RETURNING *;

-- name: IdempotencyKeyGetByScopeKey :one
-- The read before a claim, and the whole of a replay: only the columns that
-- tell replay, mismatch and in-flight apart, and the stored response.
SELECT id, request_fingerprint, fingerprint_version, recovery_point, locked_at,
       response_status, response_headers, response_body
FROM idempotency_keys WHERE scope = @scope AND key = @key;

-- name: IdempotencyKeyFinish :execrows
-- Stores the final response. Fenced: it matches no row unless the caller
-- still holds the lock generation it claimed.
UPDATE idempotency_keys
SET recovery_point = 'finished',
    response_status = @response_status,
    response_headers = @response_headers,
    response_body = @response_body,
    locked_at = NULL,
    last_error = NULL,
    finished_at = now(),
    updated_at = now()
WHERE id = @id
  AND lock_generation = @lock_generation
  AND recovery_point <> 'finished';

-- name: IdempotencyKeyRelease :execrows
-- Records a downstream call whose outcome is unknown and frees the lock, so a
-- client retry can resume at once and the completer after next_attempt_at.
-- Fenced like IdempotencyKeyFinish.
UPDATE idempotency_keys
SET recovery_point = 'downstream_called',
    locked_at = NULL,
    attempts = attempts + 1,
    last_error = @last_error,
    next_attempt_at = now() + make_interval(secs => @retry_in_seconds::float8),
    updated_at = now()
WHERE id = @id
  AND lock_generation = @lock_generation
  AND recovery_point <> 'finished';

-- name: IdempotencyKeyClaimExpired :many
-- The completer's claim: unfinished records that are due and whose lock is
-- free or expired, taken over with a new generation. SKIP LOCKED lets several
-- server processes run completers at once without waiting on each other.
-- Only records of routes this process can resume are taken, so a process
-- that lacks an operation (an older version mid-deploy) never fences others.
UPDATE idempotency_keys
SET locked_at = now(),
    lock_generation = lock_generation + 1,
    updated_at = now()
WHERE id IN (
    SELECT ik.id FROM idempotency_keys ik
    WHERE ik.recovery_point <> 'finished'
      AND ik.next_attempt_at <= now()
      AND (ik.request_method || ' ' || ik.request_route) = ANY (@routes::text[])
      AND (ik.locked_at IS NULL
           OR ik.locked_at < now() - make_interval(secs => @lock_timeout_seconds::float8))
    ORDER BY ik.next_attempt_at
    LIMIT @max_records
    FOR UPDATE SKIP LOCKED
)
RETURNING *;

-- name: IdempotencyKeyDeleteFinishedBefore :execrows
-- One bounded retention batch: finished records created before the cutoff,
-- oldest first, through the partial index on created_at.
DELETE FROM idempotency_keys
WHERE id IN (
    SELECT ik.id FROM idempotency_keys ik
    WHERE ik.recovery_point = 'finished'
      AND ik.created_at < @created_before
    ORDER BY ik.created_at
    LIMIT @max_records
    FOR UPDATE SKIP LOCKED
);

-- name: IdempotencyKeyInspect :one
-- One account's record with the id of the ledger row it created, for GET
-- /v1/idempotency_keys/{key}: the charge of a charge's record; the refund of
-- a refund's record, and the charge it refunds. It selects the state only:
-- never the stored response body or headers, nor the fingerprint.
SELECT ik.id, ik.key, ik.request_method, ik.request_route, ik.recovery_point,
       ik.lock_generation, ik.locked_at, ik.attempts, ik.next_attempt_at,
       ik.last_error, ik.response_status, ik.created_at, ik.updated_at,
       ik.finished_at,
       c.id AS charge_id,
       r.id AS refund_id,
       r.charge_id AS refund_charge_id
FROM idempotency_keys ik
LEFT JOIN charges c ON c.idempotency_key_id = ik.id
LEFT JOIN refunds r ON r.idempotency_key_id = ik.id
WHERE ik.scope = @scope AND ik.key = @key;

-- name: IdempotencyKeySettle :execrows
-- Finishes a record from outside its own lifecycle, inside the caller's
-- transaction (a webhook that learns the outcome of a charge whose finishing
-- commit never happened). It takes the record over (generation + 1), so a
-- stale owner that wakes up later is fenced, and it matches no row when the
-- record is already finished.
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
