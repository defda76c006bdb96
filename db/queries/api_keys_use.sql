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
