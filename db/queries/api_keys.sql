-- name: APIKeyInsert :exec
-- A new key, with the id its maker chose (it may be queued in a batch).
INSERT INTO api_keys (id, account_id, key_hash, prefix, idempotency_key_id)
VALUES (@id, @account_id, @key_hash, @prefix, @idempotency_key_id);

-- name: APIKeyAuthenticate :one
-- The account of an active key, and the key's id: what every authenticated
-- request reads, once, from the database. A plain read: it takes no lock,
-- waits on none and writes nothing, so the requests of one key never queue
-- behind each other, and a revocation holds from the moment it commits, in
-- every process (I11, I15). Of the account it reads what a request uses:
-- its id, and its idempotency mode for the rollout adapter.
SELECT k.id AS key_id, k.account_id, a.idempotency_mode
FROM api_keys k JOIN accounts a ON a.id = k.account_id
WHERE k.key_hash = @key_hash AND k.revoked_at IS NULL;

-- name: APIKeyExpectActive :exec
-- First in the claim's batch of an API request: the API key that sent it
-- is still active and belongs to the account whose scope the record is
-- claimed in. A revocation committed since the request's first statement
-- read the key raises IDA01, and nothing of the batch commits: the request
-- is refused (401) as if it had come after the revocation, which it did
-- (I11). A plain read, like APIKeyAuthenticate: it takes no lock.
SELECT idempay_expect(
    (SELECT count(*) FROM api_keys
     WHERE key_hash = @key_hash AND account_id = @account_id AND revoked_at IS NULL),
    'IDA01', 'the API key is not active');

-- name: APIKeyNoteUse :exec
-- Notes the use of these keys, off the request path (Authenticator.NoteUses,
-- once a minute per process): last_used_at becomes the time of this
-- statement, at most once a minute per key whichever process saw it. A row
-- another transaction holds (a revocation, another process noting the same
-- key) is skipped rather than waited for, so this statement never waits
-- and never deadlocks; and no request waits on it, since authentication
-- takes no lock.
UPDATE api_keys SET last_used_at = now()
FROM (
    SELECT id FROM api_keys
    WHERE id = ANY (@ids::text[]) AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute')
    FOR UPDATE SKIP LOCKED
) due
WHERE api_keys.id = due.id;

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
