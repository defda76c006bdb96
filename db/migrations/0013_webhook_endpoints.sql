-- Webhooks out: idempay's events delivered to the merchants' endpoints
-- (docs/webhooks-out.md, I17). Nothing here is written on the request path:
-- the events table gets no column and no B-tree index; a dispatcher reads
-- committed events by seq (through a BRIN index, which an insert at the
-- table's end does not write) and fans each one out into one delivery per
-- matching endpoint; workers in any process claim due deliveries.

-- An endpoint disabled by idempay (it answered 410 Gone, or failed for
-- longer than the configured time) is itself an event, sent to the account's
-- other endpoints that ask for it.
ALTER TYPE event_type ADD VALUE IF NOT EXISTS 'webhook_endpoint.disabled';

CREATE TABLE webhook_endpoints (
    id                 text PRIMARY KEY CHECK (char_length(id) <= 64)
        DEFAULT idempay_ordered_id('we_'),
    account_id         text NOT NULL REFERENCES accounts (id),
    url                text NOT NULL CHECK (char_length(url) <= 2048),
    -- Event types wanted; '*' is every type.
    enabled_events     text[] NOT NULL CHECK (cardinality(enabled_events) BETWEEN 1 AND 32),
    enabled            boolean NOT NULL DEFAULT true,
    -- Why idempay disabled it ('gone': it answered 410; 'failing': it
    -- failed for longer than the configured time); NULL when enabled, or
    -- disabled by the merchant.
    disabled_reason    text CHECK (char_length(disabled_reason) <= 32),
    -- The signing secrets, sealed (AES-256-GCM under WEBHOOK_SECRETS_KEY,
    -- the endpoint's id as associated data): idempay must sign with them,
    -- so they cannot be hashed as API keys are; sealed, a copy of the
    -- database alone (a backup, a replica) does not give them away.
    secret             bytea NOT NULL CHECK (octet_length(secret) <= 128),
    -- During a rotation, the secret before, signed with as well until
    -- previous_expires_at.
    previous_secret    bytea CHECK (octet_length(previous_secret) <= 128),
    previous_expires_at timestamptz,
    -- Since when every attempt to it failed (NULL: its last attempt
    -- succeeded); it is disabled once that is longer than the configured
    -- time.
    failing_since      timestamptz,
    -- Increases with every change; orders its own events.
    version            bigint NOT NULL DEFAULT 1,
    -- The POST /v1/webhook_endpoints record that created it, for a resumed
    -- request.
    idempotency_key_id text UNIQUE REFERENCES idempotency_keys (id) ON DELETE SET NULL,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX webhook_endpoints_account ON webhook_endpoints (account_id, created_at);

-- One delivery per (event, endpoint): the dispatcher's fan-out is an
-- INSERT ... ON CONFLICT DO NOTHING, so a pass repeated after a crash
-- creates nothing twice. A delivery is pending until an attempt succeeds
-- (delivered) or the schedule ends (failed); a resend makes it pending
-- again, under the same event id.
CREATE TABLE webhook_deliveries (
    id              text PRIMARY KEY DEFAULT idempay_ordered_id('whd_'),
    event_id        text NOT NULL REFERENCES events (id),
    endpoint_id     text NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
    account_id      text NOT NULL,
    -- The event's object and version: a delivery waits while an earlier
    -- version of its object is pending for the same endpoint.
    object_id       text NOT NULL,
    object_version  bigint NOT NULL,
    state           text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'failed')),
    -- Attempts in the current schedule (a resend starts a new one).
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    -- A worker's claim: until lease_until no other worker takes it; a worker
    -- that dies leaves it due again then. claims fences a late finish from
    -- a worker whose lease ran out.
    lease_until     timestamptz,
    claims          bigint NOT NULL DEFAULT 0,
    last_status     integer,
    last_error      text CHECK (char_length(last_error) <= 1000),
    delivered_at    timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT webhook_deliveries_event_endpoint UNIQUE (event_id, endpoint_id)
);

-- The workers' scan: pending deliveries by due time.
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE state = 'pending';
-- Head of line per object: is an earlier version pending for this endpoint?
CREATE INDEX webhook_deliveries_object ON webhook_deliveries (endpoint_id, object_id, object_version)
    WHERE state = 'pending';
-- GET /v1/webhook_endpoints/{id}/deliveries, newest first.
CREATE INDEX webhook_deliveries_endpoint ON webhook_deliveries (endpoint_id, id DESC);

-- Every attempt: when it was due, when it ran, how the endpoint answered.
CREATE TABLE webhook_attempts (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    delivery_id   text NOT NULL REFERENCES webhook_deliveries (id) ON DELETE CASCADE,
    scheduled_at  timestamptz NOT NULL,
    started_at    timestamptz NOT NULL,
    duration_ms   integer NOT NULL,
    -- NULL when there was no answer (timeout, refused connection).
    status_code   integer,
    -- The first bytes of the answer's body.
    response_body text NOT NULL DEFAULT '' CHECK (char_length(response_body) <= 4096),
    error         text CHECK (char_length(error) <= 1000)
);

CREATE INDEX webhook_attempts_delivery ON webhook_attempts (delivery_id, id);

-- The dispatcher's position in the events: every event with seq <= last_seq
-- has been fanned out, except the seqs in webhook_dispatch_gaps. seq is
-- taken when an event is inserted and the event becomes visible when its
-- transaction commits, so a seq below one already read may still commit: a
-- gap. A gap is kept with the snapshot of the pass that saw it, and
-- resolved when its event appears, or when every transaction that was
-- running in that snapshot has ended: the gap's transaction was one of
-- them, since it took its seq before that snapshot and had its id before
-- it took its seq (a settling transaction writes its object, then its
-- event).
CREATE TABLE webhook_dispatcher (
    id       integer PRIMARY KEY CHECK (id = 1),
    last_seq bigint NOT NULL
);
INSERT INTO webhook_dispatcher (id, last_seq) SELECT 1, COALESCE(max(seq), 0) FROM events;

CREATE TABLE webhook_dispatch_gaps (
    seq           bigint PRIMARY KEY,
    seen_snapshot pg_snapshot NOT NULL
);

-- The dispatcher reads events by seq. A BRIN index costs an insert at the
-- table's end nothing (its range is summarized later), unlike a B-tree
-- entry on every settling write.
CREATE INDEX events_seq_brin ON events USING brin (seq);
