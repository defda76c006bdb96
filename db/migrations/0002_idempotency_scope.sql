-- Idempotency records belong to a scope, not only to an account, so that
-- every entry point shares one core: an API account (scope = the account id)
-- or a named source such as the Stripe webhook endpoint
-- (scope = 'source:stripe-webhooks'), whose keys are Stripe's event ids.
-- account_id stays, set exactly when the scope is an account, so that the
-- foreign key keeps every account's records tied to a real account.
ALTER TABLE idempotency_keys ADD COLUMN scope text;
UPDATE idempotency_keys SET scope = account_id;
ALTER TABLE idempotency_keys
    ALTER COLUMN scope SET NOT NULL,
    ALTER COLUMN account_id DROP NOT NULL,
    ADD CONSTRAINT idempotency_keys_scope_length CHECK (char_length(scope) BETWEEN 1 AND 100),
    ADD CONSTRAINT idempotency_keys_scope_is_account_or_source CHECK (
        (account_id IS NOT NULL AND scope = account_id)
        OR (account_id IS NULL AND scope LIKE 'source:%')),
    DROP CONSTRAINT idempotency_keys_account_id_key_unique,
    ADD CONSTRAINT idempotency_keys_scope_key_unique UNIQUE (scope, key);

