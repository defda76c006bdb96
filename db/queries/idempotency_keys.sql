-- name: IdempotencyKeyInsert :exec
-- The claim of a new key, first in the claim's batch. A plain INSERT, not
-- ON CONFLICT: when another request holds (scope, key), or inserted it a
-- moment ago, the unique index raises and nothing of the batch commits; the
-- runner reads the record again. An API request (key_hash set) claims only
-- under an API key that is still active and belongs to the scope's account:
-- a revocation committed since the request's first statement read the key
-- raises IDA01, and nothing of the batch commits (I11). A plain read of the
-- key: it takes no lock. The lock, the creation (the retry ceiling's start)
-- and the completer's schedule are stamped by one clock, the one every later
-- statement of the record compares them with (docs/lifecycle.md, "One clock").
INSERT INTO idempotency_keys (
    id, scope, key, request_method, request_route, request_fingerprint,
    locked_at, created_at, next_attempt_at
)
SELECT @id, @scope::text, @key, @request_method, @request_route, @request_fingerprint,
       coalesce(sqlc.narg(now)::timestamptz, now()), coalesce(sqlc.narg(now)::timestamptz, now()),
       coalesce(sqlc.narg(now)::timestamptz, now())
WHERE CASE WHEN sqlc.narg(key_hash)::bytea IS NULL THEN true
           ELSE idempay_expect((SELECT count(*) FROM api_keys
                                WHERE key_hash = sqlc.narg(key_hash) AND account_id = @scope::text
                                  AND revoked_at IS NULL),
                               'IDA01', 'the API key is not active') > 0
      END;

-- name: IdempotencyKeyTakeover :one
-- Takes over a resumable record (lock free or older than the lock timeout;
-- of a @bounded route, under the retry ceiling, I16) at the generation the
-- read saw, with a new generation that fences the old owner's late writes.
-- An API request's key (key_hash) must still be active and own the record,
-- as in the claim's INSERT. No row: the record changed or crossed the
-- ceiling since the read, or the key was revoked; the next read tells which.
UPDATE idempotency_keys ik
SET locked_at = coalesce(sqlc.narg(now)::timestamptz, now()),
    lock_generation = ik.lock_generation + 1,
    updated_at = now()
WHERE ik.id = @id
  AND ik.lock_generation = @lock_generation
  AND ik.recovery_point IN ('started', 'downstream_called')
  AND (ik.locked_at IS NULL
       OR ik.locked_at < coalesce(sqlc.narg(now)::timestamptz, now()) - make_interval(secs => @lock_timeout_seconds::float8))
  AND (NOT @bounded::boolean
       OR ik.created_at >= coalesce(sqlc.narg(now)::timestamptz, now()) - make_interval(secs => @retry_ceiling_seconds::float8))
  AND (sqlc.narg(key_hash)::bytea IS NULL
       OR EXISTS (SELECT 1 FROM api_keys k
                  WHERE k.key_hash = sqlc.narg(key_hash) AND k.account_id = ik.account_id AND k.revoked_at IS NULL))
  AND set_config('lock_timeout', @row_lock_wait::text, true) IS NOT NULL -- its wait for the row (lockwait.go)
RETURNING *;

-- name: IdempotencyKeyGetByScopeKey :one
-- The read before a claim, and the whole of a replay: only the columns that
-- tell replay, mismatch, in flight, parked and resumable apart, and the
-- stored response. Lock freshness and the retry ceiling (I16) are decided
-- by the database's clock, or the test's (docs/lifecycle.md, "One clock").
SELECT id, request_fingerprint, recovery_point, lock_generation,
       (locked_at IS NOT NULL
        AND locked_at >= coalesce(sqlc.narg(now)::timestamptz, now()) - make_interval(secs => @lock_timeout_seconds::float8))::boolean AS lock_fresh,
       (created_at < coalesce(sqlc.narg(now)::timestamptz, now()) - make_interval(secs => @retry_ceiling_seconds::float8))::boolean AS past_ceiling,
       response_status, response_headers, response_body
FROM idempotency_keys WHERE scope = @scope AND key = @key;

-- name: IdempotencyKeyGetByCredential :one
-- The first statement of an API request, and the whole of an API replay:
-- the active API key whose SHA-256 is key_hash, its account's idempotency
-- mode, and the record under key in that account's scope, read together so
-- that authenticating costs no round trip of its own (I15; docs/lifecycle.md,
-- step 1). The record's columns are IdempotencyKeyGetByScopeKey's, NULL when
-- there is none (always for the key "": keys are 1..255 characters). No row:
-- the API key is unknown or revoked. Three unique-index scans.
SELECT k.account_id, a.idempotency_mode, k.id AS key_id,
       ik.id, ik.request_fingerprint, coalesce(ik.recovery_point::text, '')::text AS recovery_point, ik.lock_generation,
       (ik.locked_at IS NOT NULL
        AND ik.locked_at >= coalesce(sqlc.narg(now)::timestamptz, now()) - make_interval(secs => @lock_timeout_seconds::float8))::boolean AS lock_fresh,
       coalesce(ik.created_at < coalesce(sqlc.narg(now)::timestamptz, now()) - make_interval(secs => @retry_ceiling_seconds::float8), false)::boolean AS past_ceiling,
       ik.response_status, ik.response_headers, ik.response_body
FROM api_keys k
JOIN accounts a ON a.id = k.account_id
LEFT JOIN idempotency_keys ik ON ik.scope = k.account_id AND ik.key = @key
WHERE k.key_hash = @key_hash AND k.revoked_at IS NULL;

-- name: IdempotencyKeyFinish :exec
-- Stores the final response, first in the finishing batch. Fenced: IDF01,
-- and nothing of the batch commits, unless the caller holds its generation.
WITH k AS (
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
      AND recovery_point <> 'finished'
      AND set_config('lock_timeout', @row_lock_wait::text, true) IS NOT NULL -- the batch's waits for a row (lockwait.go)
    RETURNING 1
)
SELECT idempay_expect((SELECT count(*) FROM k), 'IDF01', 'fenced: the idempotency record was taken over');

-- name: IdempotencyKeyRelease :execrows
-- Frees a record whose phase did not finish (release), fenced like
-- IdempotencyKeyFinish; a retry resumes it, the completer after next_attempt_at.
UPDATE idempotency_keys
SET recovery_point = CASE WHEN @called::boolean THEN 'downstream_called' ELSE recovery_point END,
    locked_at = NULL,
    attempts = attempts + 1,
    last_error = @last_error,
    next_attempt_at = coalesce(sqlc.narg(now)::timestamptz, now()) + make_interval(secs => @retry_in_seconds::float8),
    updated_at = now()
WHERE id = @id
  AND lock_generation = @lock_generation
  AND recovery_point <> 'finished'
  AND set_config('lock_timeout', @row_lock_wait::text, true) IS NOT NULL; -- its wait for the row (lockwait.go)

-- name: IdempotencyKeyPark :execrows
-- Parks one record past the retry ceiling that a client's retry found, at
-- the generation the read saw, as IdempotencyKeyParkExpired parks a batch.
-- 0 rows: the record changed since the read; the runner reads it again.
UPDATE idempotency_keys
SET recovery_point = 'parked',
    locked_at = NULL,
    lock_generation = lock_generation + 1,
    updated_at = now()
WHERE id = @id
  AND lock_generation = @lock_generation
  AND recovery_point IN ('started', 'downstream_called')
  AND (locked_at IS NULL
       OR locked_at < coalesce(sqlc.narg(now)::timestamptz, now()) - make_interval(secs => @lock_timeout_seconds::float8))
  AND set_config('lock_timeout', @row_lock_wait::text, true) IS NOT NULL; -- its wait for the row (lockwait.go)
