-- name: ChargeGetByID :one
SELECT * FROM charges WHERE account_id = @account_id AND id = @id;

-- name: ChargeGetByIdempotencyKeyID :one
SELECT * FROM charges WHERE idempotency_key_id = @idempotency_key_id;

-- name: ChargeGetByIDForUpdate :one
SELECT * FROM charges WHERE account_id = @account_id AND id = @id FOR UPDATE;

-- name: ChargeList :many
-- Newest first. The cursor is the last charge of the previous page; a NULL
-- cursor starts at the newest.
SELECT * FROM charges
WHERE account_id = @account_id
  AND (sqlc.narg(cursor_created_at)::timestamptz IS NULL
       OR (created_at, id) < (sqlc.narg(cursor_created_at)::timestamptz, sqlc.narg(cursor_id)::text))
ORDER BY created_at DESC, id DESC
LIMIT @max_rows;

-- name: ChargeAddRefunded :exec
-- Reserves (positive delta) or releases (negative delta) refunded amount; the
-- table's CHECK rejects any change that would exceed the charge.
UPDATE charges
SET amount_refunded = amount_refunded + @delta, updated_at = now()
WHERE id = @id;

-- name: ChargeFindForEvent :one
-- The charge a Stripe event is about: by the idempotency record or the
-- charge id that idempay put in the charge's metadata, or by Stripe's id.
-- Events carry no account: the account comes from the row.
SELECT id FROM charges
WHERE idempotency_key_id = sqlc.narg(record_id)
   OR id = sqlc.narg(charge_id)
   OR stripe_charge_id = sqlc.narg(stripe_charge_id)
LIMIT 1;

-- name: ChargeGetForUpdate :one
SELECT * FROM charges WHERE id = @id FOR UPDATE;

-- name: ChargeReleaseRefunded :exec
-- Releases a refund that failed at Stripe after it was reserved (or
-- succeeded). It never goes below zero: amount_refunded may have been raised
-- to Stripe's own figure by an event (ChargeApplyEvent).
UPDATE charges
SET amount_refunded = GREATEST(0, amount_refunded - @amount::bigint), updated_at = now()
WHERE id = @id;

-- name: ChargeApplyEvent :one
-- Applies a Stripe event's view of the charge. The caller decides that the
-- status moves forward; amount_refunded only ever grows here (the larger of
-- ours, which counts refunds in flight, and Stripe's), so an event applied
-- late cannot undo a refund.
UPDATE charges
SET status = @status,
    stripe_charge_id = COALESCE(stripe_charge_id, sqlc.narg(stripe_charge_id)),
    failure_code = COALESCE(sqlc.narg(failure_code), failure_code),
    failure_message = COALESCE(sqlc.narg(failure_message), failure_message),
    amount_refunded = LEAST(amount, GREATEST(amount_refunded, @stripe_amount_refunded::bigint)),
    last_event_at = GREATEST(last_event_at, @event_created::timestamptz),
    updated_at = now()
WHERE id = @id
RETURNING *;

-- name: ChargeGet :one
-- A charge of any account, for operator commands (idempay webhooks trigger).
SELECT * FROM charges WHERE id = @id;

-- name: ChargeClaimAndInsert :one
-- The claim phase of a charge in one statement (one round trip, one
-- commit): the claim of IdempotencyKeyClaim, word for word (a test keeps
-- the two the same), and the ledger row when the claim inserted the record
-- (lock generation 1). A takeover inserts no row; a refused claim returns
-- no row, and the caller reads the record as for IdempotencyKeyClaim.
WITH k AS (
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
RETURNING *
), ch AS (
    INSERT INTO charges (account_id, idempotency_key_id, amount, currency, payment_method, description, metadata)
    SELECT k.account_id, k.id, @amount, @currency, @payment_method, @description, @metadata
    FROM k WHERE k.lock_generation = 1
    RETURNING id, created_at
)
SELECT k.id, k.scope, k.account_id, k.key, k.request_method, k.request_route, k.recovery_point,
       k.lock_generation, k.attempts,
       ch.id AS charge_id, ch.created_at AS charge_created_at
FROM k LEFT JOIN ch ON true;

-- name: ChargeFinish :one
-- The finishing phase of a charge in one statement: the record's final
-- response (fenced by the lock generation, as IdempotencyKeyFinish), the
-- ledger row's outcome, and, for a settled charge, its event (as
-- EventInsert). When the record was taken over, nothing is written and the
-- count is 0.
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
    WHERE idempotency_keys.id = @record_id
      AND lock_generation = @lock_generation
      AND recovery_point <> 'finished'
    RETURNING idempotency_keys.id
), ch AS (
    UPDATE charges
    SET status = @status,
        stripe_charge_id = @stripe_charge_id,
        failure_code = @failure_code,
        failure_message = @failure_message,
        updated_at = now()
    WHERE charges.id = @charge_id AND EXISTS (SELECT 1 FROM k)
    RETURNING charges.id, charges.account_id
), next AS (
    UPDATE accounts SET event_seq = event_seq + 1
    WHERE accounts.id = (SELECT account_id FROM ch) AND @event_type::text <> ''
    RETURNING event_seq
), ev AS (
    INSERT INTO events (account_id, account_seq, type, object_id, data)
    SELECT ch.account_id, next.event_seq, @event_type::text, ch.id, @event_data FROM ch, next
    RETURNING events.id
)
SELECT count(*) FROM k;
