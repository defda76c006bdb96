-- name: IdempotencyKeyClaimExpired :many
-- The completer's claim: resumable records that are due and whose lock is
-- free or expired, taken over with a new generation. SKIP LOCKED lets several
-- server processes run completers at once without waiting on each other.
-- Only records of routes this process can resume are taken, so a process
-- that lacks an operation (an older version mid-deploy) never fences others;
-- and a record of a route under the retry ceiling (ceiling_routes) is not
-- taken once it is older than the ceiling: IdempotencyKeyParkExpired parks it
-- instead (I16).
UPDATE idempotency_keys
SET locked_at = coalesce(sqlc.narg(now)::timestamptz, now()),
    lock_generation = lock_generation + 1,
    updated_at = now()
WHERE id IN (
    SELECT ik.id FROM idempotency_keys ik
    WHERE ik.recovery_point IN ('started', 'downstream_called')
      AND ik.next_attempt_at <= coalesce(sqlc.narg(now)::timestamptz, now())
      AND (ik.request_method || ' ' || ik.request_route) = ANY (@routes::text[])
      AND (ik.locked_at IS NULL
           OR ik.locked_at < coalesce(sqlc.narg(now)::timestamptz, now()) - make_interval(secs => @lock_timeout_seconds::float8))
      AND (ik.created_at >= coalesce(sqlc.narg(now)::timestamptz, now()) - make_interval(secs => @retry_ceiling_seconds::float8)
           OR NOT (ik.request_method || ' ' || ik.request_route) = ANY (@ceiling_routes::text[]))
    ORDER BY ik.next_attempt_at
    LIMIT @max_records
    FOR UPDATE SKIP LOCKED
)
RETURNING *;

-- name: IdempotencyKeyParkExpired :many
-- One bounded batch of the completer's parking (I16): resumable records of
-- the routes under the ceiling that are older than the ceiling and whose lock
-- is free or expired move to parked, with a new generation, so that an old
-- owner that wakes up later is fenced. A parked record is never called
-- downstream again; Stripe's events and reconciliation finish it
-- (IdempotencyKeySettle). The scan is the completer's own index, which holds
-- only the records it may resume: few, whatever the size of the table.
UPDATE idempotency_keys
SET recovery_point = 'parked',
    locked_at = NULL,
    lock_generation = lock_generation + 1,
    updated_at = now()
WHERE id IN (
    SELECT ik.id FROM idempotency_keys ik
    WHERE ik.recovery_point IN ('started', 'downstream_called')
      AND ik.created_at < coalesce(sqlc.narg(now)::timestamptz, now()) - make_interval(secs => @retry_ceiling_seconds::float8)
      AND (ik.request_method || ' ' || ik.request_route) = ANY (@ceiling_routes::text[])
      AND (ik.locked_at IS NULL
           OR ik.locked_at < coalesce(sqlc.narg(now)::timestamptz, now()) - make_interval(secs => @lock_timeout_seconds::float8))
    ORDER BY ik.next_attempt_at
    LIMIT @max_records
    FOR UPDATE SKIP LOCKED
)
RETURNING id, request_method, request_route, attempts, created_at;
