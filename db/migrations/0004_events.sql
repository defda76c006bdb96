-- Events out: what idempay settled, for other services (fulfilment,
-- accounting). A row is inserted in the transaction that settles a charge or
-- refund, whichever entry point finished it (HTTP, the completer, a broker
-- message, a webhook): no event without its commit, no commit without its
-- event (I10). The relay publishes rows with published_at IS NULL to NATS
-- JetStream in seq order, with Nats-Msg-Id = id, and then sets published_at;
-- a publish repeated after a crash is dropped by JetStream's duplicate
-- window. The same rows serve GET /v1/events.
--
-- account_seq numbers one account's events in commit order: it is taken from
-- accounts.event_seq under that row's lock in the settling transaction, so
-- two transactions of one account get their numbers in the order they
-- commit, and seq (the table's order) follows it within an account. The
-- relay publishes in seq order, so each account's events arrive in order.
ALTER TABLE accounts ADD COLUMN event_seq bigint NOT NULL DEFAULT 0;

CREATE TABLE events (
    id           text PRIMARY KEY CHECK (char_length(id) <= 64)
        DEFAULT 'evt_' || replace(gen_random_uuid()::text, '-', ''),
    seq          bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    account_id   text NOT NULL REFERENCES accounts (id),
    account_seq  bigint NOT NULL CHECK (account_seq > 0),
    type         text NOT NULL CHECK (type IN ('charge.succeeded', 'charge.failed', 'refund.succeeded', 'refund.failed')),
    object_id    text NOT NULL CHECK (char_length(object_id) <= 64),
    -- The object as the API showed it when the event happened.
    data         jsonb NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz,
    CONSTRAINT events_account_seq_unique UNIQUE (account_id, account_seq)
);

-- The relay's scan: unpublished events in order.
CREATE INDEX events_unpublished ON events (seq) WHERE published_at IS NULL;
