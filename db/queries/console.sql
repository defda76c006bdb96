-- The console's reads, and its sign-out (internal/console). Every query
-- names the account it reads for, so an account never sees another's rows
-- (I5). The console adds no index: an index costs every first request a
-- write, and these reads are one person's. The records list walks the account's records
-- through the (scope, key) index, which retention keeps to a day's worth;
-- the refunds list reads the account's refunds.

-- name: ConsoleSessionAccount :one
-- The account a console session belongs to, read at every request from the
-- session's key id: a revoked key ends the session at once (I11, I15), and
-- so does a sign-out since the session was issued (ConsoleSignOut): the
-- session names the key's count of sign-outs it signed in under. The
-- session's age is judged here too, by the database's clock, the one that
-- stamped its issue (ConsoleSignIn), in seconds, so that no process's clock
-- decides it and a time no timestamp holds is no error. The key's
-- hash is the credential of the request's one write (a resend), whose claim
-- checks the key again as an API request's claim does.
SELECT a.id, a.name, k.prefix, k.key_hash
FROM api_keys k JOIN accounts a ON a.id = k.account_id
WHERE k.id = @key_id AND k.account_id = @account_id AND k.revoked_at IS NULL
  AND k.console_sign_outs = @sign_outs
  AND extract(epoch FROM now()) - @lifetime_seconds::float8 < @issued::bigint;

-- name: ConsoleSignIn :one
-- The count of sign-outs a new session signs in under (ConsoleSignOut),
-- and its issue time, by the database's clock (whole Unix seconds, rounded
-- down), which ConsoleSessionAccount judges its age with.
SELECT console_sign_outs, floor(extract(epoch FROM now()))::bigint AS issued
FROM api_keys WHERE id = @key_id AND account_id = @account_id AND revoked_at IS NULL;

-- name: ConsoleSignOut :exec
-- "Sign out": ends every console session of the key issued until now, in
-- every process, at its next request. A count, not a time: no process's
-- clock decides which sessions it ends. Only a session still current
-- counts (its count is the key's, and it is younger than its lifetime, as
-- ConsoleSessionAccount judges): one that has ended already ends nothing,
-- so a kept copy of its cookie cannot sign the key's later sessions out.
-- The key's row is locked by others too (a revocation, the API's use of
-- the key): the UPDATE waits for it at most @row_lock_wait
-- (IDEMPOTENCY_ROW_LOCK_WAIT), set in its own WHERE clause as a retry's
-- takeover does (internal/idempotency/lockwait.go), and past it fails with
-- lock_not_available, signing nothing out.
UPDATE api_keys SET console_sign_outs = console_sign_outs + 1
WHERE id = @key_id AND account_id = @account_id AND console_sign_outs = @sign_outs
  AND extract(epoch FROM now()) - @lifetime_seconds::float8 < @issued::bigint
  AND set_config('lock_timeout', @row_lock_wait::text, true) IS NOT NULL;

-- name: ConsoleSessionCurrent :exec
-- A resend's check that its session is still current, queued first in the
-- resend's claim batch: its key active and not signed out since the
-- session began, or IDA01 and nothing of the batch commits. The session's
-- look-up (ConsoleSessionAccount) is a statement of its own, before it, so
-- a sign-out committed in between is refused here, as the claim refuses a
-- revocation (I11).
SELECT idempay_expect((SELECT count(*) FROM api_keys
                       WHERE id = @key_id AND account_id = @account_id AND revoked_at IS NULL
                         AND console_sign_outs = @sign_outs),
                      'IDA01', 'the console session has ended');

-- name: ConsoleRecordList :many
-- The account's idempotency records, newest first, in one state or all
-- (an empty state for all), each state as the claim's judgement of a retry
-- would find it (its clock: the database's, the lock timeout and the retry
-- ceiling). in_flight: unfinished, its lock fresh (a retry gets 409);
-- waiting: unfinished, its lock free or expired, under the ceiling, so a
-- retry or the completer takes it over; parked: parked, or unfinished past
-- the retry ceiling (I16) on a route that calls downstream, with its lock
-- free or expired, which a retry or the completer's next pass parks: never
-- called downstream again, it waits for Stripe's event or reconciliation;
-- finished: it has its stored answer.
SELECT * FROM (
    SELECT ik.id, ik.key, ik.request_method, ik.request_route, ik.recovery_point,
           ik.lock_generation, ik.locked_at, ik.attempts, ik.next_attempt_at, ik.last_error,
           ik.response_status, ik.created_at, ik.updated_at, ik.finished_at,
           (ik.locked_at IS NOT NULL
            AND ik.locked_at >= now() - make_interval(secs => @lock_timeout_seconds::float8))::boolean AS lock_fresh,
           coalesce(ik.created_at < now() - make_interval(secs => @retry_ceiling_seconds::float8)
                    AND NOT (ik.request_method || ' ' || ik.request_route) = ANY (@local_routes::text[]), false)::boolean AS past_ceiling,
           c.id AS charge_id, r.id AS refund_id, r.charge_id AS refund_charge_id, p.id AS pending_charge_id,
           k.id AS api_key_id
    FROM idempotency_keys ik
    LEFT JOIN charges c ON c.idempotency_key_id = ik.id
    LEFT JOIN refunds r ON r.idempotency_key_id = ik.id
    LEFT JOIN charges p ON p.pending_record_id = ik.id
    LEFT JOIN api_keys k ON k.idempotency_key_id = ik.id
    WHERE ik.scope = @account_id
) rec
WHERE CASE @state::text
        WHEN 'finished' THEN rec.recovery_point = 'finished'
        WHEN 'parked' THEN rec.recovery_point = 'parked'
             OR (rec.recovery_point <> 'finished' AND NOT rec.lock_fresh AND rec.past_ceiling)
        WHEN 'in_flight' THEN rec.recovery_point NOT IN ('finished', 'parked') AND rec.lock_fresh
        WHEN 'waiting' THEN rec.recovery_point NOT IN ('finished', 'parked') AND NOT rec.lock_fresh AND NOT rec.past_ceiling
        ELSE true
      END
ORDER BY rec.created_at DESC, rec.id DESC
LIMIT @max_rows;

-- name: ConsoleRecordGet :one
-- One of the account's records, with its fingerprint and stored answer;
-- lock_fresh and past_ceiling as ConsoleRecordList reads them.
SELECT ik.id, ik.key, ik.request_method, ik.request_route, ik.recovery_point,
       ik.lock_generation, ik.locked_at, ik.attempts, ik.next_attempt_at, ik.last_error,
       ik.response_status, ik.created_at, ik.updated_at, ik.finished_at,
       (ik.locked_at IS NOT NULL
        AND ik.locked_at >= now() - make_interval(secs => @lock_timeout_seconds::float8))::boolean AS lock_fresh,
       coalesce(ik.created_at < now() - make_interval(secs => @retry_ceiling_seconds::float8)
                AND NOT (ik.request_method || ' ' || ik.request_route) = ANY (@local_routes::text[]), false)::boolean AS past_ceiling,
       ik.request_fingerprint, ik.response_headers, ik.response_body,
       c.id AS charge_id, r.id AS refund_id, r.charge_id AS refund_charge_id, p.id AS pending_charge_id,
       k.id AS api_key_id
FROM idempotency_keys ik
LEFT JOIN charges c ON c.idempotency_key_id = ik.id
LEFT JOIN refunds r ON r.idempotency_key_id = ik.id
LEFT JOIN charges p ON p.pending_record_id = ik.id
LEFT JOIN api_keys k ON k.idempotency_key_id = ik.id
WHERE ik.scope = @account_id AND ik.id = @id;

-- name: ConsoleChargeList :many
-- The account's charges, newest first (the API's index).
SELECT id, amount, currency, status, GREATEST(amount_refunded, stripe_amount_refunded)::bigint AS amount_refunded, amount_captured, capture_method,
       stripe_payment_intent_id, idempotency_key_id, version, created_at, updated_at
FROM charges WHERE account_id = @account_id
ORDER BY created_at DESC, id DESC
LIMIT @max_rows;

-- name: ConsoleChargeGet :one
SELECT * FROM charges WHERE account_id = @account_id AND id = @id;

-- name: ConsoleRefundList :many
-- The account's refunds, newest first; an empty charge_id for all of them.
SELECT id, charge_id, amount, status, stripe_refund_id, idempotency_key_id, version, created_at, updated_at
FROM refunds
WHERE account_id = @account_id AND (@charge_id::text = '' OR charge_id = @charge_id::text)
ORDER BY created_at DESC, id DESC
LIMIT @max_rows;

-- name: ConsoleEventList :many
-- The account's events, newest first (the API's index); an empty object_id for
-- all of them, else one object's, whose object_version is its status
-- history.
SELECT id, seq, type, object_id, object_version, created_at, published_at
FROM events
WHERE account_id = @account_id AND (@object_id::text = '' OR object_id = @object_id::text)
ORDER BY created_at DESC, seq DESC
LIMIT @max_rows;

-- name: ConsoleEventGet :one
SELECT * FROM events WHERE account_id = @account_id AND id = @id;
