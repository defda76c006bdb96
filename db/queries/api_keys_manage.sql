-- name: APIKeyInsert :exec
-- A new key, with the id its maker chose (it may be queued in a batch).
INSERT INTO api_keys (id, account_id, key_hash, prefix, idempotency_key_id)
VALUES (@id, @account_id, @key_hash, @prefix, @idempotency_key_id);

-- name: APIKeyList :many
SELECT * FROM api_keys WHERE account_id = @account_id AND revoked_at IS NULL ORDER BY created_at, id;

-- name: APIKeyGetByIdempotencyKeyID :one
SELECT * FROM api_keys WHERE idempotency_key_id = @idempotency_key_id;

-- name: APIKeyRevoke :exec
-- Revokes one active key of the account, unless it is the account's last
-- active key. The account row is locked first, so two revocations of an
-- account's last two keys cannot both succeed. Guarded: the caller checked
-- both conditions in a read; when they no longer hold it raises IDS01 and
-- the caller reads and checks again.
WITH acct AS (
    SELECT id FROM accounts WHERE accounts.id = @account_id FOR UPDATE
), others AS (
    SELECT count(*) AS n FROM api_keys, acct
    WHERE api_keys.account_id = acct.id AND api_keys.revoked_at IS NULL AND api_keys.id <> @id
), k AS (
    UPDATE api_keys SET revoked_at = now()
    FROM others
    WHERE api_keys.id = @id AND api_keys.account_id = @account_id AND api_keys.revoked_at IS NULL AND others.n > 0
    RETURNING 1
)
SELECT idempay_expect((SELECT count(*) FROM k), 'IDS01', 'the API key or the account''s keys changed since they were read');

-- name: APIKeyGetByID :one
SELECT * FROM api_keys WHERE account_id = @account_id AND id = @id;
