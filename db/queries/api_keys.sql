-- name: APIKeyInsert :one
INSERT INTO api_keys (account_id, key_hash, prefix, idempotency_key_id)
VALUES (@account_id, @key_hash, @prefix, @idempotency_key_id)
RETURNING *;

-- name: APIKeyAuthenticate :one
-- The account of an active key, and the key's id. It notes the key's use at
-- most once a minute, so authentication costs a write only then (the
-- authenticator's cache absorbs the rest).
WITH k AS (
    UPDATE api_keys
    SET last_used_at = CASE WHEN last_used_at IS NULL OR last_used_at < now() - interval '1 minute'
                            THEN now() ELSE last_used_at END
    WHERE key_hash = @key_hash AND revoked_at IS NULL
    RETURNING id, account_id
)
SELECT k.id AS key_id, a.id, a.name, a.created_at, a.idempotency_mode
FROM k JOIN accounts a ON a.id = k.account_id;

-- name: APIKeyList :many
SELECT * FROM api_keys WHERE account_id = @account_id AND revoked_at IS NULL ORDER BY created_at, id;

-- name: APIKeyGetByIdempotencyKeyID :one
SELECT * FROM api_keys WHERE idempotency_key_id = @idempotency_key_id;

-- name: APIKeyRevoke :one
-- Revokes one active key of the account, unless it is the account's last
-- active key (then no row: the caller tells which). The account row is
-- locked first, so two revocations of an account's last two keys cannot
-- both succeed.
WITH acct AS (
    SELECT id FROM accounts WHERE accounts.id = @account_id FOR UPDATE
), others AS (
    SELECT count(*) AS n FROM api_keys, acct
    WHERE api_keys.account_id = acct.id AND api_keys.revoked_at IS NULL AND api_keys.id <> @id
)
UPDATE api_keys SET revoked_at = now()
FROM others
WHERE api_keys.id = @id AND api_keys.account_id = @account_id AND api_keys.revoked_at IS NULL AND others.n > 0
RETURNING api_keys.*;

-- name: APIKeyGetByID :one
SELECT * FROM api_keys WHERE account_id = @account_id AND id = @id;
