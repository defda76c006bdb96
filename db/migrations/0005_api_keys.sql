-- API keys of their own: an account may hold several (rotation: create the
-- new key, move the clients, revoke the old one), each revocable at once.
-- Only a key's SHA-256 is stored; the prefix shown in listings is the
-- key's first characters, enough to recognise it, too few to use it.
CREATE TABLE api_keys (
    id                 text PRIMARY KEY CHECK (char_length(id) <= 64)
        DEFAULT 'key_' || replace(gen_random_uuid()::text, '-', ''),
    account_id         text NOT NULL REFERENCES accounts (id),
    key_hash           bytea NOT NULL UNIQUE CHECK (octet_length(key_hash) = 32),
    prefix             text NOT NULL CHECK (char_length(prefix) <= 20),
    -- The POST /v1/api_keys record that created it, for a resumed request.
    idempotency_key_id text UNIQUE REFERENCES idempotency_keys (id) ON DELETE SET NULL,
    created_at         timestamptz NOT NULL DEFAULT now(),
    last_used_at       timestamptz,
    revoked_at         timestamptz
);

CREATE INDEX api_keys_account_active ON api_keys (account_id, created_at) WHERE revoked_at IS NULL;

-- Each account's existing key becomes its first api_keys row.
INSERT INTO api_keys (account_id, key_hash, prefix, created_at)
SELECT id, api_key_hash, 'sk_idem_', created_at FROM accounts;

ALTER TABLE accounts DROP COLUMN api_key_hash;

-- How the account's mutating requests use idempotency (a rollout, account by
-- account): required (a request without a key is refused: the default),
-- optional (a request without a key runs unprotected, and is counted),
-- shadow (keys are recorded and duplicates detected and counted as
-- would-have-replayed, but every request runs as before).
ALTER TABLE accounts ADD COLUMN idempotency_mode text NOT NULL DEFAULT 'required'
    CHECK (idempotency_mode IN ('required', 'optional', 'shadow'));
