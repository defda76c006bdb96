-- name: APIKeyInsert :exec
-- A new key, with the id its maker chose (it may be queued in a batch).
INSERT INTO api_keys (id, account_id, key_hash, prefix, idempotency_key_id)
VALUES (@id, @account_id, @key_hash, @prefix, @idempotency_key_id);

-- name: APIKeyList :many
-- The account's active keys, newest first (api_keys_account_active,
-- backwards). The cursor is the (created_at, id) of the last key of the
-- previous page (NULL: from the newest).
SELECT * FROM api_keys
WHERE account_id = @account_id AND revoked_at IS NULL
  AND (sqlc.narg(cursor_created_at)::timestamptz IS NULL
       OR (created_at, id) < (sqlc.narg(cursor_created_at)::timestamptz, sqlc.narg(cursor_id)::text))
ORDER BY created_at DESC, id DESC
LIMIT @max_rows;

-- name: APIKeyGetByIdempotencyKeyID :one
SELECT * FROM api_keys WHERE idempotency_key_id = @idempotency_key_id;

-- name: APIKeyLockAccount :exec
-- Locks the account's row, in a statement of its own before a revocation
-- checks and revokes (APIKeyRevoke), so that revocations of one account's
-- keys run one after another. The lock cannot be taken in the revoking
-- statement itself: in READ COMMITTED a statement reads with the snapshot
-- it took when it started, before it waited for the lock, so two
-- revocations of an account's last two keys would each count the other's
-- key as active and both commit, leaving the account no key (and no way to
-- make one). The statement after this one takes a new snapshot once the
-- lock is held, and sees every revocation committed before it. FOR NO KEY
-- UPDATE: it does not wait for, or hold up, an insert that checks its
-- foreign key to the account (a new key: FOR KEY SHARE).
SELECT 1 FROM accounts WHERE id = @account_id FOR NO KEY UPDATE;

-- name: APIKeyRevoke :exec
-- Revokes one active key of the account, unless it is the account's last
-- active key, in the same transaction (or batch) as APIKeyLockAccount and
-- after it. Guarded: the caller checked both conditions in a read; when
-- they no longer hold it raises IDS01 and the caller reads and checks
-- again.
WITH others AS (
    SELECT count(*) AS n FROM api_keys
    WHERE api_keys.account_id = @account_id AND api_keys.revoked_at IS NULL AND api_keys.id <> @id
), k AS (
    UPDATE api_keys SET revoked_at = now()
    FROM others
    WHERE api_keys.id = @id AND api_keys.account_id = @account_id AND api_keys.revoked_at IS NULL AND others.n > 0
    RETURNING 1
)
SELECT idempay_expect((SELECT count(*) FROM k), 'IDS01', 'the API key or the account''s keys changed since they were read');

-- name: APIKeyGetByID :one
SELECT * FROM api_keys WHERE account_id = @account_id AND id = @id;
