-- Accounts own API keys; every idempotency record and ledger row belongs to
-- exactly one account. The API key itself is never stored, only its SHA-256.
CREATE TABLE accounts (
    id           text PRIMARY KEY CHECK (char_length(id) <= 64)
        DEFAULT 'acct_' || replace(gen_random_uuid()::text, '-', ''),
    name         text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 200),
    api_key_hash bytea NOT NULL UNIQUE CHECK (octet_length(api_key_hash) = 32),
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- One row per (account, Idempotency-Key). The unique constraint is what makes
-- the claim atomic: INSERT ... ON CONFLICT, never check-then-insert.
--
-- recovery_point moves started -> downstream_called -> finished. A record is
-- owned by whoever holds lock_generation; every phase write names the
-- generation it holds, so a takeover (generation + 1) fences the old owner.
CREATE TABLE idempotency_keys (
    id                  text PRIMARY KEY CHECK (char_length(id) <= 64)
        DEFAULT 'ik_' || replace(gen_random_uuid()::text, '-', ''),
    account_id          text NOT NULL REFERENCES accounts (id),
    key                 text NOT NULL CHECK (char_length(key) BETWEEN 1 AND 255),
    request_method      text NOT NULL CHECK (char_length(request_method) <= 16),
    request_route       text NOT NULL CHECK (char_length(request_route) <= 200),
    request_fingerprint bytea NOT NULL CHECK (octet_length(request_fingerprint) = 32),
    recovery_point      text NOT NULL DEFAULT 'started'
        CHECK (recovery_point IN ('started', 'downstream_called', 'finished')),
    lock_generation     bigint NOT NULL DEFAULT 1,
    locked_at           timestamptz,
    -- Downstream attempts that ended with an unknown outcome, and when the
    -- background completer may try again (exponential backoff).
    attempts            integer NOT NULL DEFAULT 0,
    next_attempt_at     timestamptz NOT NULL DEFAULT now(),
    last_error          text CHECK (char_length(last_error) <= 1000),
    response_status     integer CHECK (response_status BETWEEN 100 AND 599),
    response_headers    jsonb,
    response_body       bytea,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    finished_at         timestamptz,
    CONSTRAINT idempotency_keys_account_id_key_unique UNIQUE (account_id, key),
    CONSTRAINT idempotency_keys_finished_has_response
        CHECK ((recovery_point = 'finished') = (response_status IS NOT NULL AND finished_at IS NOT NULL))
);

-- The completer scans only unfinished records, in the order they are due.
CREATE INDEX idempotency_keys_unfinished_next_attempt
    ON idempotency_keys (next_attempt_at) WHERE recovery_point <> 'finished';

-- Retention deletes finished records oldest first, in bounded batches; this
-- partial index keeps each batch an index range scan whatever the table size.
CREATE INDEX idempotency_keys_finished_created
    ON idempotency_keys (created_at) WHERE recovery_point = 'finished';

-- The ledger. A charge row is written in the same transaction as its
-- idempotency record at every phase. It outlives the record: retention sets
-- idempotency_key_id to NULL. amount_refunded counts refunds that succeeded or
-- are in flight, so the CHECK below makes over-refunding impossible.
CREATE TABLE charges (
    id                 text PRIMARY KEY CHECK (char_length(id) <= 64)
        DEFAULT 'ch_' || replace(gen_random_uuid()::text, '-', ''),
    account_id         text NOT NULL REFERENCES accounts (id),
    idempotency_key_id text UNIQUE REFERENCES idempotency_keys (id) ON DELETE SET NULL,
    amount             bigint NOT NULL CHECK (amount > 0 AND amount <= 99999999),
    currency           text NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    payment_method     text NOT NULL CHECK (char_length(payment_method) BETWEEN 1 AND 255),
    description        text CHECK (char_length(description) <= 1000),
    metadata           jsonb NOT NULL DEFAULT '{}',
    status             text NOT NULL DEFAULT 'processing'
        CHECK (status IN ('processing', 'pending', 'succeeded', 'failed')),
    amount_refunded    bigint NOT NULL DEFAULT 0
        CHECK (amount_refunded >= 0 AND amount_refunded <= amount),
    stripe_charge_id   text CHECK (char_length(stripe_charge_id) <= 255),
    failure_code       text CHECK (char_length(failure_code) <= 255),
    failure_message    text CHECK (char_length(failure_message) <= 1000),
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now()
);

-- Newest-first cursor pagination per account.
CREATE INDEX charges_account_created ON charges (account_id, created_at DESC, id DESC);

CREATE TABLE refunds (
    id                 text PRIMARY KEY CHECK (char_length(id) <= 64)
        DEFAULT 're_' || replace(gen_random_uuid()::text, '-', ''),
    account_id         text NOT NULL REFERENCES accounts (id),
    idempotency_key_id text UNIQUE REFERENCES idempotency_keys (id) ON DELETE SET NULL,
    charge_id          text NOT NULL REFERENCES charges (id),
    amount             bigint NOT NULL CHECK (amount > 0),
    status             text NOT NULL DEFAULT 'processing'
        CHECK (status IN ('processing', 'pending', 'succeeded', 'failed')),
    stripe_refund_id   text CHECK (char_length(stripe_refund_id) <= 255),
    failure_code       text CHECK (char_length(failure_code) <= 255),
    failure_message    text CHECK (char_length(failure_message) <= 1000),
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX refunds_charge_id ON refunds (charge_id);
