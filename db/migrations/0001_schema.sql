-- idempay's schema, read top to bottom: the two functions the queries call,
-- idempay's own vocabularies as enum types, then each table with what it
-- holds, why each index exists and what keeps its writes cheap. sqlc reads
-- this file as the schema of the queries in db/queries.
--
-- Rules the schema keeps:
-- - Foreign keys wherever one row names another that must exist (a refund
--   or dispute its charge, a delivery its endpoint, a key or an endpoint
--   its account), except to accounts from the tables every request writes
--   (records, charges, refunds, events): checking one locks the account's
--   row FOR KEY SHARE until commit (a MultiXact written into its header),
--   one row that all of an account's requests write, which the design
--   forbids. Their account id comes from the statement that authenticated
--   the request, and accounts are never deleted: nothing to catch. A ledger
--   row names the record that made it ON DELETE SET NULL: retention deletes
--   the record, the row stays (Stripe's metadata keeps the record's id).
-- - A state on a table that every request writes (a record's recovery
--   point, a charge's or refund's status, an event's type) is an enum: an
--   unknown label is refused when it is read in (22P02) and costs nothing
--   afterwards, where a CHECK (x IN (...)) is planned again at every write.
--   Elsewhere a CHECK lists the values; a vocabulary Stripe owns (a
--   dispute's status) is text with a CHECK, since Stripe may add values and
--   an enum label is never removed.
-- - A length limit on a table that every request writes is its type,
--   varchar(n): checked where a value is assigned, inside the cached plan,
--   and never for a column an UPDATE leaves alone. PostgreSQL plans every
--   CHECK of a table again at every INSERT and UPDATE (ExecRelCheck): a
--   quarter of its CPU under first requests when these limits were CHECKs
--   (docs/benchmarks-history.md, "Measured, then cut"). A CHECK there
--   relates columns, bounds a number, or states a shape no type states (a
--   fingerprint's 32 bytes, a currency's three letters, a key that is not
--   empty); rarely written tables keep their lengths as CHECK
--   (char_length(x) <= n).
-- - A JSON document the database never looks into (a record's stored
--   headers, a charge's metadata, an event's data) is json, kept as written:
--   jsonb would parse and rebuild it at every write, and print it at every read.
-- - No trigger, and no copy of a value beside the row that owns it: where
--   an index makes an update cost more (charges), the cost is chosen here.
--
-- Changing the schema: history was folded into this file while idempay has
-- no installed base. From the first database kept, a change is a new file
-- (0002_what.sql, ...), never an edit: the migrator refuses to start when an
-- applied file changed (db/migrate.go). A new enum label is ALTER TYPE ...
-- ADD VALUE in a file of its own; an index on a large table is an
-- operational step (CREATE INDEX CONCURRENTLY runs in no transaction).

-- The guard of every phase's batch, which PostgreSQL runs as one implicit
-- transaction (docs/lifecycle.md, "One path, one batch per phase"): a
-- statement that must match a row and does not raises, so nothing of the
-- batch commits. Its SQLSTATEs are idempay's own (internal/idempotency/batch.go):
-- IDF01 fenced, IDS01 stale (the step runs again), IDE01 expired, IDA01 the
-- API key no longer active.
CREATE FUNCTION idempay_expect(matched bigint, sqlstate text, what text) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    IF matched = 0 THEN
        RAISE EXCEPTION 'idempay: %', what USING ERRCODE = sqlstate;
    END IF;
    RETURN matched;
END
$$;

-- Ids that grow with time (only an order) for rows whose id the database
-- gives (webhook endpoints and deliveries): an insert lands at the primary
-- key's right edge, not on a random page. Ledger ids derive from the request
-- (docs/lifecycle.md, section 3): their default serves rows made by hand.
CREATE FUNCTION idempay_ordered_id(prefix text) RETURNS text
LANGUAGE sql VOLATILE AS $$
    SELECT prefix
        || lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0')
        || substr(replace(gen_random_uuid()::text, '-', ''), 1, 20)
$$;

-- idempay's own vocabularies, labels in the order a state moves. Go sees
-- strings (sqlc.yaml's overrides): pgx sends an unknown type as text.
CREATE TYPE recovery_point AS ENUM ('started', 'downstream_called', 'parked', 'finished');
CREATE TYPE charge_status AS ENUM (
    'processing', 'requires_action', 'requires_capture', 'pending', 'succeeded', 'failed', 'canceled');
CREATE TYPE charge_capture_method AS ENUM ('automatic', 'manual');
CREATE TYPE charge_pending_action AS ENUM ('capture', 'cancel');
CREATE TYPE refund_status AS ENUM ('processing', 'pending', 'succeeded', 'failed');
CREATE TYPE event_type AS ENUM (
    'charge.succeeded', 'charge.failed', 'charge.requires_capture', 'charge.canceled',
    'refund.succeeded', 'refund.failed', 'webhook_endpoint.disabled');

-- An account: a merchant, never deleted. idempotency_mode rolls idempotency
-- out account by account (docs/api.md, "Rollout").
CREATE TABLE accounts (
    id               text PRIMARY KEY CHECK (char_length(id) <= 64)
        DEFAULT 'acct_' || replace(gen_random_uuid()::text, '-', ''),
    name             text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 200),
    idempotency_mode text NOT NULL DEFAULT 'required'
        CHECK (idempotency_mode IN ('required', 'optional', 'shadow')),
    created_at       timestamptz NOT NULL DEFAULT now()
);

-- The idempotency record: one per (scope, Idempotency-Key). The scope is an
-- account's id or a named source ('source:stripe-webhooks', keyed by Stripe's
-- event ids). The id is a pure function of the request (idempotency.RecordID),
-- so a record the database lost is re-created with the id Stripe's metadata
-- carries (I13). UNIQUE (scope, key) makes the claim atomic: the claim
-- inserts and the index refuses a taken key; never check-then-insert.
-- recovery_point and the fence, lock_generation (IDF01): docs/lifecycle.md,
-- section 2; attempts, next_attempt_at and last_error pace the completer.
--
-- Row shape: inserted by its claim, updated once by its finish, which
-- stores the response; fillfactor 80 keeps that version on its page. It is
-- not HOT: the finish changes recovery_point, which the predicates of the
-- two partial indexes name, so the completer and retention read only theirs.
CREATE TABLE idempotency_keys (
    id                  varchar(64) PRIMARY KEY DEFAULT 'ik_' || replace(gen_random_uuid()::text, '-', ''),
    scope               varchar(100) NOT NULL,
    account_id          text GENERATED ALWAYS AS (  -- no foreign key: see the rules above
                            CASE WHEN scope LIKE 'source:%' THEN NULL ELSE scope END) STORED,
    key                 varchar(255) NOT NULL,
    request_method      varchar(16) NOT NULL,
    request_route       varchar(200) NOT NULL,
    request_fingerprint bytea NOT NULL CHECK (octet_length(request_fingerprint) = 32),
    recovery_point      recovery_point NOT NULL DEFAULT 'started',
    lock_generation     bigint NOT NULL DEFAULT 1,
    locked_at           timestamptz,
    attempts            integer NOT NULL DEFAULT 0,
    next_attempt_at     timestamptz NOT NULL DEFAULT now(),
    last_error          varchar(1000),
    response_status     integer CHECK (response_status BETWEEN 100 AND 599),
    response_headers    json,
    response_body       bytea,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    finished_at         timestamptz,
    CONSTRAINT idempotency_keys_scope_key_unique UNIQUE (scope, key),
    CONSTRAINT idempotency_keys_not_empty CHECK (key <> '' AND scope <> ''),
    CONSTRAINT idempotency_keys_finished_has_response
        CHECK ((recovery_point = 'finished') = (response_status IS NOT NULL AND finished_at IS NOT NULL))
) WITH (fillfactor = 80);

-- The completer claims the records it may resume, in the order they are
-- due; a finished or parked record is not in this index at all.
CREATE INDEX idempotency_keys_resumable_next_attempt ON idempotency_keys (next_attempt_at)
    WHERE recovery_point IN ('started', 'downstream_called');

-- Retention deletes finished records oldest first, in bounded batches: an
-- index range scan whatever the table's size, never an unfinished record.
CREATE INDEX idempotency_keys_finished_created ON idempotency_keys (created_at)
    WHERE recovery_point = 'finished';

-- An account's API keys, several during a rotation, each revocable at once.
-- Only a key's SHA-256 is stored: every request reads its key by that hash
-- (the UNIQUE index), with its account, in the round trip it makes anyway.
-- prefix is enough of the key to recognise it in a listing, too little to use.
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
    revoked_at         timestamptz,
    -- The console's "Sign out"s: a session names the count it signed in under.
    console_sign_outs  integer NOT NULL DEFAULT 0
);

-- An account's keys in use, for its listing.
CREATE INDEX api_keys_account_active ON api_keys (account_id, created_at) WHERE revoked_at IS NULL;

-- The ledger: a charge, backed by a Stripe PaymentIntent, written in the
-- same batch as its idempotency record at every phase; it outlives the
-- record. stripe_charge_id is the PaymentIntent's latest charge, which
-- Stripe's charge and dispute events name; the finish sets both Stripe ids.
--
-- capture_method manual: the request only authorized ("capture": false).
-- The amounts' CHECKs forbid over-capturing and over-refunding (refunds in
-- flight count) whatever the code does.
--
-- Two figures of what was refunded: amount_refunded, idempay's own
-- (reserved by a refund's claim, released if it fails), the one that
-- limits a refund; and stripe_amount_refunded, Stripe's as of the newest
-- charge event (stripe_refunded_at; a refund's failure moves it), which an
-- older event never changes (I8). The API shows the larger. Stripe's may
-- count a refund a restore lost, whose retry must reach Stripe (I13).
--
-- A capture's or cancel's claim sets pending_action, its record and a
-- capture's amount (NULL: all capturable), guarded by version, so of a
-- capture and a cancel racing exactly one begins.
--
-- version increases with every change: a write names the version it read
-- (IDS01 when it moved), an event carries it. last_event_at: an older
-- Stripe event never overwrites a newer state (I8).
--
-- Row shape: fillfactor 80 leaves room for the updates after the insert.
-- The finish sets the Stripe ids, which the partial indexes below hold, so
-- it is not HOT; a trigger-kept table of the ids made it HOT and measured
-- the same (docs/benchmarks-history.md, "Measured, then cut"). An update
-- that changes neither a Stripe id nor pending_record_id (a refund's
-- reservation, most Stripe events) is HOT while its page has room, and
-- checks no foreign key, which only an insert or a change of the key does.
CREATE TABLE charges (
    id                       varchar(64) PRIMARY KEY DEFAULT idempay_ordered_id('ch_'),
    account_id               text NOT NULL,  -- no foreign key: see the rules above
    idempotency_key_id       text UNIQUE REFERENCES idempotency_keys (id) ON DELETE SET NULL,
    amount                   bigint NOT NULL CHECK (amount > 0 AND amount <= 99999999),
    currency                 text NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    payment_method           varchar(255) NOT NULL,
    description              varchar(1000),
    metadata                 json NOT NULL DEFAULT '{}',
    capture_method           charge_capture_method NOT NULL DEFAULT 'automatic',
    status                   charge_status NOT NULL DEFAULT 'processing',
    amount_capturable        bigint NOT NULL DEFAULT 0,
    amount_captured          bigint NOT NULL DEFAULT 0,
    amount_refunded          bigint NOT NULL DEFAULT 0,
    stripe_amount_refunded   bigint NOT NULL DEFAULT 0,
    stripe_refunded_at       timestamptz,
    stripe_payment_intent_id varchar(255),
    stripe_charge_id         varchar(255),
    -- The customer's next step when requires_action (3-D Secure's redirect).
    next_action_url          varchar(2048),
    failure_code             varchar(255),
    failure_message          varchar(1000),
    pending_action           charge_pending_action,
    pending_record_id        text REFERENCES idempotency_keys (id) ON DELETE SET NULL,
    pending_amount           bigint,
    version                  bigint NOT NULL DEFAULT 1 CHECK (version > 0),
    last_event_at            timestamptz,
    created_at               timestamptz NOT NULL DEFAULT now(),
    updated_at               timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT charges_payment_method_not_empty CHECK (payment_method <> ''),
    CONSTRAINT charges_capturable_check CHECK (amount_capturable >= 0 AND amount_capturable <= amount),
    CONSTRAINT charges_captured_check CHECK (amount_captured >= 0 AND amount_captured <= amount),
    CONSTRAINT charges_amount_refunded_check CHECK (amount_refunded >= 0 AND amount_refunded <= amount_captured),
    CONSTRAINT charges_stripe_amount_refunded_check CHECK (stripe_amount_refunded >= 0 AND stripe_amount_refunded <= amount_captured),
    CONSTRAINT charges_pending_amount_check CHECK (pending_amount > 0 AND pending_amount <= amount)
) WITH (fillfactor = 80);

-- An account's charges newest first, for cursor pagination.
CREATE INDEX charges_account_created ON charges (account_id, created_at DESC, id DESC);

-- The charge of a capture or cancel in flight, by its record, and the foreign
-- key's ON DELETE SET NULL lookup (pending_record_id = $1 implies IS NOT
-- NULL). Partial: nearly every charge's is NULL, which a full index holds.
CREATE UNIQUE INDEX charges_pending_record_id ON charges (pending_record_id)
    WHERE pending_record_id IS NOT NULL;

-- A Stripe event (or reconciliation) finds its charge by the Stripe ids it
-- names (ChargeFindForEvent). Partial: no Stripe id until the finish.
CREATE INDEX charges_stripe_payment_intent_id ON charges (stripe_payment_intent_id)
    WHERE stripe_payment_intent_id IS NOT NULL;
CREATE INDEX charges_stripe_charge_id ON charges (stripe_charge_id)
    WHERE stripe_charge_id IS NOT NULL;

-- A refund of a charge; the same phases and the same rules as a charge.
-- Its amount is reserved on the charge (amount_refunded) in the refund's
-- claim, so two refunds racing cannot together exceed what was captured.
CREATE TABLE refunds (
    id                 varchar(64) PRIMARY KEY DEFAULT idempay_ordered_id('re_'),
    account_id         text NOT NULL,  -- no foreign key: see the rules above
    idempotency_key_id text UNIQUE REFERENCES idempotency_keys (id) ON DELETE SET NULL,
    charge_id          text NOT NULL REFERENCES charges (id),
    amount             bigint NOT NULL CHECK (amount > 0),
    status             refund_status NOT NULL DEFAULT 'processing',
    stripe_refund_id   varchar(255),
    failure_code       varchar(255),
    failure_message    varchar(1000),
    version            bigint NOT NULL DEFAULT 1 CHECK (version > 0),
    last_event_at      timestamptz,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now()
);

-- A charge's refunds.
CREATE INDEX refunds_charge_id ON refunds (charge_id);
-- A Stripe event finds its refund by Stripe's refund id (RefundFindForEvent).
CREATE INDEX refunds_stripe_refund_id ON refunds (stripe_refund_id) WHERE stripe_refund_id IS NOT NULL;

-- Disputes of a charge, from Stripe's events (no part of amount_refunded).
-- allows_refund, what a refund checks, comes with the status from one
-- event: the status allows one (no chargeback, open or lost:
-- stripeevents.disputeStates) and so does Stripe (is_charge_refundable).
CREATE TABLE disputes (
    id                text PRIMARY KEY CHECK (char_length(id) <= 64)
        DEFAULT 'dis_' || replace(gen_random_uuid()::text, '-', ''),
    account_id        text NOT NULL REFERENCES accounts (id),
    charge_id         text NOT NULL REFERENCES charges (id),
    stripe_dispute_id text NOT NULL UNIQUE CHECK (char_length(stripe_dispute_id) <= 255),
    amount            bigint NOT NULL CHECK (amount > 0),
    currency          text NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    reason            text CHECK (char_length(reason) <= 100),
    status            text NOT NULL CHECK (status IN (
        'warning_needs_response', 'warning_under_review', 'warning_closed',
        'needs_response', 'under_review', 'won', 'lost')),
    allows_refund     boolean NOT NULL,
    last_event_at     timestamptz NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now()
);

-- A charge's disputes (a refund checks them).
CREATE INDEX disputes_charge_id ON disputes (charge_id);

-- The inbox of Stripe events, delivered at least once, out of order,
-- sometimes days later; the event id makes each one's effect happen once
-- (I8). A row is inserted in the batch that claims the event's record (a
-- 2xx only once it is durable), and processed_at is set, WHERE
-- processed_at IS NULL, in the batch that changes the ledger. The row
-- outlives the record: a redelivery after retention changes nothing.
CREATE TABLE stripe_events (
    id                 text PRIMARY KEY CHECK (char_length(id) BETWEEN 1 AND 255),
    type               text NOT NULL CHECK (char_length(type) BETWEEN 1 AND 100),
    api_version        text CHECK (char_length(api_version) <= 20),
    -- data.object.id: the PaymentIntent, charge, refund or dispute at Stripe.
    object_id          text CHECK (char_length(object_id) <= 255),
    -- Stripe's created time of the event: what orders events, never arrival.
    stripe_created     timestamptz NOT NULL,
    -- The verified event as received, for processing and for audit.
    payload            jsonb NOT NULL,
    idempotency_key_id text UNIQUE REFERENCES idempotency_keys (id) ON DELETE SET NULL,
    -- NULL until processed. stale: older than the ledger's state; ignored: a
    -- type idempay does not handle; unknown_object: an object idempay never
    -- created, flagged, not applied; failed: its object does not decode.
    outcome            text CHECK (outcome IN ('applied', 'stale', 'ignored', 'unknown_object', 'failed')),
    received_at        timestamptz NOT NULL DEFAULT now(),
    processed_at       timestamptz,
    -- Processing attempts, the failed ones and the last, and the last failure.
    attempts           integer NOT NULL DEFAULT 0,
    last_error         text CHECK (char_length(last_error) <= 1000),
    CONSTRAINT stripe_events_processed_has_outcome CHECK ((processed_at IS NULL) = (outcome IS NULL))
);

-- Events received and not yet processed, oldest first.
CREATE INDEX stripe_events_unprocessed ON stripe_events (received_at) WHERE processed_at IS NULL;

-- Events out (docs/events.md): a row is inserted in the batch that settles
-- a charge or refund, whichever entry point finished it (I10). The relay
-- publishes them in seq order; they also serve GET /v1/events and the
-- webhooks out. The id is a pure function of the event (events.ID: its
-- account, type and object, and the version for a type that can recur), so
-- an event recorded again after a restore or a failover lost its commit
-- has the id the relay and the webhooks may have sent (I10, I17); it is
-- the unique index over what makes an event, and an insert that finds it
-- taken does nothing (EventInsert). Like the ledger ids it does not grow
-- with time, so an insert lands on a random page of the primary key: ids
-- that grew with time measured no different (docs/benchmarks-history.md,
-- "Where PostgreSQL spends, per first request"). object_version is the
-- version the settling batch's guarded update wrote; that row's lock
-- orders one object's events (docs/events.md, "Order per object"). No
-- unique index repeats it, nor is one on seq (an identity): an entry less
-- per event; tests check the order. object_id names a charge, a refund or
-- an endpoint, so no foreign key.
CREATE TABLE events (
    id             varchar(64) PRIMARY KEY,
    seq            bigint GENERATED ALWAYS AS IDENTITY,
    account_id     text NOT NULL,  -- no foreign key: see the rules above
    type           event_type NOT NULL,
    object_id      varchar(64) NOT NULL,
    object_version bigint NOT NULL CHECK (object_version > 0),
    -- The object as the API showed it when the event happened.
    data           json NOT NULL,
    -- The statement's time, after its object's update took the row's lock:
    -- an object's events are in version order by (created_at, seq).
    created_at     timestamptz NOT NULL DEFAULT statement_timestamp(),
    published_at   timestamptz
);

-- The relay's scan: unpublished events in order.
CREATE INDEX events_unpublished ON events (seq) WHERE published_at IS NULL;
-- An account's events as created: GET /v1/events and the console page it
-- backwards; a recovery reads its window from since, a chunk at a time
-- (WebhookRecoveryExpand), not the account's history. The one B-tree entry
-- per event that a settling write pays, at the end of its account's range.
CREATE INDEX events_account_created ON events (account_id, created_at, seq);
-- The webhook dispatcher reads events by seq. A BRIN index costs an insert
-- at the table's end nothing, unlike a B-tree entry on every settling write.
CREATE INDEX events_seq_brin ON events USING brin (seq);

-- Webhooks out, off the request path (docs/webhooks-out.md, I17): a
-- dispatcher fans each committed event out into one delivery per matching
-- endpoint; workers in any process claim due deliveries. An endpoint that
-- idempay disables (410 Gone, or failing too long) is itself an event.
CREATE TABLE webhook_endpoints (
    id                  text PRIMARY KEY CHECK (char_length(id) <= 64)
        DEFAULT idempay_ordered_id('we_'),
    account_id          text NOT NULL REFERENCES accounts (id),
    url                 text NOT NULL CHECK (char_length(url) <= 2048),
    -- Event types wanted; '*' is every type.
    enabled_events      text[] NOT NULL CHECK (cardinality(enabled_events) BETWEEN 1 AND 32),
    enabled             boolean NOT NULL DEFAULT true,
    -- Why idempay disabled it ('gone', 'failing'); NULL otherwise.
    disabled_reason     text CHECK (char_length(disabled_reason) <= 32),
    -- The signing secrets, sealed, not hashed: idempay signs with them
    -- (docs/webhooks-out.md, "The secret at rest"). During a rotation,
    -- previous_secret signs as well until previous_expires_at.
    secret              bytea NOT NULL CHECK (octet_length(secret) <= 128),
    previous_secret     bytea CHECK (octet_length(previous_secret) <= 128),
    previous_expires_at timestamptz,
    -- Since when every attempt failed (NULL: the last one succeeded).
    failing_since       timestamptz,
    -- Increases with every change; orders its own events.
    version             bigint NOT NULL DEFAULT 1,
    -- The POST /v1/webhook_endpoints record that created it.
    idempotency_key_id  text UNIQUE REFERENCES idempotency_keys (id) ON DELETE SET NULL,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now()
);

-- An account's endpoints, for its listing and for the dispatcher's fan-out.
CREATE INDEX webhook_endpoints_account ON webhook_endpoints (account_id, created_at);

-- One delivery per (event, endpoint): the fan-out is an INSERT ... ON
-- CONFLICT DO NOTHING, so a pass repeated after a crash creates nothing
-- twice (its states: docs/webhooks-out.md, "A delivery"). event_id and
-- account_id have no foreign key: the fan-out copies them from the event
-- row, neither is ever deleted, and a check per row would lock each event
-- row. fillfactor 70 leaves room for the claim's update, which changes no
-- indexed column and so is HOT when the page has room.
CREATE TABLE webhook_deliveries (
    id              text PRIMARY KEY DEFAULT idempay_ordered_id('whd_'),
    event_id        text NOT NULL,  -- no foreign key: see above
    endpoint_id     text NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
    -- The event's account, object and version: the deliveries API lists by
    -- account, and a delivery waits while an earlier version is pending.
    account_id      text NOT NULL,  -- no foreign key: see above
    object_id       text NOT NULL,
    object_version  bigint NOT NULL,
    state           text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'paused', 'delivered', 'failed')),
    -- Attempts in the current schedule (a resend starts a new one).
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    -- Claimed by a worker until lease_until; claims fences a late finish.
    lease_until     timestamptz,
    claims          bigint NOT NULL DEFAULT 0,
    last_status     integer,
    last_error      text CHECK (char_length(last_error) <= 1000),
    delivered_at    timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT webhook_deliveries_event_endpoint UNIQUE (event_id, endpoint_id)
) WITH (fillfactor = 70);

-- The workers' scan: pending deliveries by due time (a paused one, whose
-- endpoint is disabled, is not in it, so no claim reads past it).
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE state = 'pending';
-- Head of line per object: the lowest version unfinished for this endpoint;
-- also an endpoint's unfinished deliveries when it is disabled or enabled.
-- The predicate says "pending" as "neither delivered nor failed", as the
-- claim's check does (WebhookDeliveryClaim), so that whatever the statistics
-- say only this index can answer that check, not the due index.
CREATE INDEX webhook_deliveries_object ON webhook_deliveries (endpoint_id, object_id, object_version)
    WHERE state <> 'delivered' AND state <> 'failed';
-- GET /v1/webhook_endpoints/{id}/deliveries, newest first.
CREATE INDEX webhook_deliveries_endpoint ON webhook_deliveries (endpoint_id, id DESC);

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

-- A delivery's attempts in order.
CREATE INDEX webhook_attempts_delivery ON webhook_attempts (delivery_id, id);

-- A recovery of an endpoint (docs/webhooks-out.md, "Recovery"): recorded
-- by its request, expanded by the workers a chunk of the account's events
-- at a time, each chunk's deliveries and its cursor in one commit
-- (WebhookRecoveryExpand). It goes with its endpoint.
CREATE TABLE webhook_recoveries (
    id                 text PRIMARY KEY CHECK (char_length(id) <= 64),
    account_id         text NOT NULL REFERENCES accounts (id),
    endpoint_id        text NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
    since              timestamptz NOT NULL,
    -- The request's transaction time, the events' clock: the later events
    -- are the fan-out's.
    until              timestamptz NOT NULL DEFAULT now(),
    -- The cursor: the (created_at, seq) of the last event read; (since,
    -- 0) before the first chunk.
    after_created_at   timestamptz NOT NULL,
    after_seq          bigint NOT NULL DEFAULT 0,
    done_at            timestamptz,
    idempotency_key_id text UNIQUE REFERENCES idempotency_keys (id) ON DELETE SET NULL
);

-- The workers' scan, every pass: the recoveries not done, oldest first
-- (an idle pass reads a page, however many are done).
CREATE INDEX webhook_recoveries_pending ON webhook_recoveries (until) WHERE done_at IS NULL;

-- The dispatcher's position: every event with seq <= last_seq was fanned
-- out, except the seqs in webhook_dispatch_gaps, each kept until its event
-- appears or every transaction that could still commit it has ended
-- (docs/webhooks-out.md, "How it runs"). One row.
CREATE TABLE webhook_dispatcher (
    id       integer PRIMARY KEY CHECK (id = 1),
    last_seq bigint NOT NULL
);
INSERT INTO webhook_dispatcher (id, last_seq) VALUES (1, 0);

CREATE TABLE webhook_dispatch_gaps (
    seq          bigint PRIMARY KEY,
    -- The id of the first pass after the one that kept the gap: every
    -- transaction that may still commit the gap's event has a lower id.
    -- NULL until that pass stamps it (WebhookDispatchGapsStamp).
    settle_after xid8
);
