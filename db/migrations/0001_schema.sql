-- idempay's schema, in one file, to be read top to bottom.
--
-- How it is organised: the two functions the queries call, idempay's own
-- vocabularies as enum types, then each table with what it holds, why each
-- index exists and what keeps its writes cheap. The queries that use them
-- are in db/queries (one file per table); sqlc reads this file as the schema.
--
-- Rules the schema keeps:
--
-- - Foreign keys wherever one row names another that must exist, except
--   to accounts from the tables that every request writes. A refund or
--   dispute names its charge, a delivery its event and endpoint, a key and
--   a webhook endpoint their account. A ledger row names the idempotency
--   record that made it ON DELETE SET NULL: retention deletes the record,
--   the ledger row stays (the record's id is in Stripe's metadata, so
--   reconciliation can still tie the two together). The records, charges,
--   refunds and events have no foreign key to accounts, on purpose:
--   checking one locks the parent row FOR KEY SHARE until commit, so every
--   request of an account would lock that account's one row, twice, shared
--   with all of the account's requests in flight (each overlap a MultiXact
--   written into the row's header). That is one row that all of an
--   account's requests write, on the settling path, which the design
--   forbids. The account id these rows carry comes from the statement that
--   authenticated the request (an active key's account, read in the same
--   round trip), and accounts are never deleted, so there is nothing for
--   the foreign key to catch.
-- - A state on a table that every request writes (a record's recovery
--   point, a charge's status, a refund's, an event's type) is an enum: an
--   unknown label is refused when it is read in (SQLSTATE 22P02) and costs
--   nothing afterwards, where a CHECK (x IN (...)) is parsed and planned
--   again at every write (see the next rule). Elsewhere (an account's mode,
--   a Stripe event's outcome, a delivery's state) a CHECK lists the values
--   beside the column. A vocabulary that Stripe owns (a dispute's status)
--   is text with a CHECK in any case: Stripe may add values, and a CHECK is
--   changed by one statement, where an enum's label can never be taken
--   back.
-- - A length limit on a table that every request writes is the column's
--   type, varchar(n): checked where a value is assigned, inside the
--   statement's cached plan, and never for a column an UPDATE leaves alone.
--   PostgreSQL instead reads back and plans every CHECK constraint of a
--   table at every INSERT and UPDATE (ExecRelCheck), whichever columns it
--   sets; a CPU profile under first requests put a quarter of PostgreSQL's
--   time there when these limits were CHECKs (BENCHMARKS.md, "Measured, then
--   cut"). What relates columns or bounds a number (amounts, the finished
--   record's response, the scope) is a CHECK: no type can say it. Tables
--   that requests rarely write (accounts, keys, disputes, Stripe's events,
--   webhooks) say their lengths as CHECK (char_length(x) <= n): there the
--   cost does not matter, and the CHECK says the rule in words.
-- - A JSON document that the database stores and hands back but never looks
--   into (a record's stored headers, a charge's metadata, an event's data)
--   is json, kept as the server wrote it: jsonb would parse and rebuild it
--   at every write and print it again at every read, work nothing here
--   uses. A replay returns its stored headers as they were written.
-- - No trigger, and no copy of a value kept beside the row that owns it.
--   Where an index makes an update cost more (see charges), the cost is
--   chosen here and measured, not hidden in a second table.
--
-- Changing the schema. idempay has no installed base yet, so its history
-- was folded into this one file. From the first database that must be kept,
-- every change is a new numbered file beside this one (0002_what.sql, ...),
-- never an edit of an applied file: the migrator (db/migrate.go) records
-- each file's SHA-256 and refuses to start when an applied file changed. A
-- new enum label is ALTER TYPE ... ADD VALUE in a file of its own; a new
-- index on a large table belongs in an operational step (CREATE INDEX
-- CONCURRENTLY cannot run in a migration's transaction).

-- Every phase of a request is one pipelined batch that PostgreSQL runs as
-- one implicit transaction: the core's own statement first, then the
-- operation's writes. A statement that must match a row and does not raises
-- an error inside the batch, so nothing of the batch commits. This is that
-- guard. Its SQLSTATEs are idempay's own (internal/idempotency/batch.go):
-- IDF01, fenced (the record was taken over by a newer lock generation);
-- IDS01, stale (a row changed since the operation read it; the runner runs
-- the step again); IDE01, expired (the ledger row already exists: the same
-- request ran before and its record has since been purged).
CREATE FUNCTION idempay_expect(matched bigint, sqlstate text, what text) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    IF matched = 0 THEN
        RAISE EXCEPTION 'idempay: %', what USING ERRCODE = sqlstate;
    END IF;
    RETURN matched;
END
$$;

-- Ids that grow with time, for rows whose id the database gives (events,
-- webhook deliveries): an insert lands at the right edge of the primary
-- key's index instead of on a random page. The time in them is only an
-- order; nothing reads it. The record's id, which idempay sends to Stripe,
-- and the ledger ids derived from it are pure functions of the request
-- instead (idempotency.RecordID), given by the code; the id defaults of
-- those tables serve rows made by hand (tests, an operator).
CREATE FUNCTION idempay_ordered_id(prefix text) RETURNS text
LANGUAGE sql VOLATILE AS $$
    SELECT prefix
        || lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0')
        || substr(replace(gen_random_uuid()::text, '-', ''), 1, 20)
$$;

-- idempay's own vocabularies. Go sees the labels as strings (sqlc.yaml's
-- overrides); pgx sends a string for a type it does not know in text form,
-- which is what an enum reads. The order of the labels is the order a
-- state moves in.
CREATE TYPE recovery_point AS ENUM ('started', 'downstream_called', 'parked', 'finished');
CREATE TYPE charge_status AS ENUM (
    'processing', 'requires_action', 'requires_capture', 'pending', 'succeeded', 'failed', 'canceled');
CREATE TYPE charge_capture_method AS ENUM ('automatic', 'manual');
CREATE TYPE charge_pending_action AS ENUM ('capture', 'cancel');
CREATE TYPE refund_status AS ENUM ('processing', 'pending', 'succeeded', 'failed');
CREATE TYPE event_type AS ENUM (
    'charge.succeeded', 'charge.failed', 'charge.requires_capture', 'charge.canceled',
    'refund.succeeded', 'refund.failed', 'webhook_endpoint.disabled');

-- An account: a merchant. Every idempotency record of an account scope,
-- every ledger row, event, API key and webhook endpoint belongs to exactly
-- one. Accounts are never deleted.
--
-- idempotency_mode rolls idempotency out account by account: required (a
-- mutating request without a key is refused: the default), optional (such
-- a request runs unprotected, and is counted), shadow (keys are recorded
-- and duplicates counted as would-have-replayed, but every request runs).
CREATE TABLE accounts (
    id               text PRIMARY KEY CHECK (char_length(id) <= 64)
        DEFAULT 'acct_' || replace(gen_random_uuid()::text, '-', ''),
    name             text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 200),
    idempotency_mode text NOT NULL DEFAULT 'required'
        CHECK (idempotency_mode IN ('required', 'optional', 'shadow')),
    created_at       timestamptz NOT NULL DEFAULT now()
);

-- The idempotency record: one per (scope, Idempotency-Key). The scope is an
-- account (scope = account_id) or a named source such as Stripe's webhook
-- endpoint (scope = 'source:stripe-webhooks', account_id NULL), whose keys
-- are Stripe's event ids; every entry point shares this one core. The id
-- is a pure function of the scope, the key and the request's fingerprint
-- (idempotency.RecordID), so a record lost with the database's last commits
-- is re-created with the same id, and Stripe (whose metadata carries it)
-- replays instead of charging again.
--
-- The UNIQUE (scope, key) constraint makes the claim atomic: the claim
-- inserts, and the unique index refuses a key that is taken; never
-- check-then-insert. recovery_point moves started ->
-- downstream_called -> finished, or to parked once a record is older than
-- the retry ceiling (I16): never called downstream again, left to Stripe's
-- events and reconciliation. lock_generation fences: every phase write
-- names the generation it holds, and a takeover (generation + 1) makes a
-- late write from the old owner fail (IDF01). attempts, next_attempt_at and
-- last_error pace the background completer after unknown outcomes.
--
-- Row shape: every record is inserted by its claim and updated by its
-- finish, which stores the response. fillfactor 80 leaves room on each page
-- for that update, so the new version of the row stays on its page. It is
-- not a HOT update (no index entry skipped): the finish changes
-- recovery_point, which the two partial indexes' predicates name; that is
-- what lets the completer and retention read only what they want.
CREATE TABLE idempotency_keys (
    id                  varchar(64) PRIMARY KEY DEFAULT 'ik_' || replace(gen_random_uuid()::text, '-', ''),
    scope               varchar(100) NOT NULL,
    account_id          text,  -- no foreign key: see the rules above
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
    CONSTRAINT idempotency_keys_scope_is_account_or_source CHECK (
        (account_id IS NOT NULL AND scope = account_id)
        OR (account_id IS NULL AND scope LIKE 'source:%')),
    CONSTRAINT idempotency_keys_finished_has_response
        CHECK ((recovery_point = 'finished') = (response_status IS NOT NULL AND finished_at IS NOT NULL))
) WITH (fillfactor = 80);

-- The completer claims the records it may resume, in the order they are
-- due; a finished or parked record is not in this index at all.
CREATE INDEX idempotency_keys_resumable_next_attempt ON idempotency_keys (next_attempt_at)
    WHERE recovery_point IN ('started', 'downstream_called');

-- Retention deletes finished records oldest first, in bounded batches: an
-- index range scan whatever the table's size. An unfinished record is not
-- in it, so retention never removes one.
CREATE INDEX idempotency_keys_finished_created ON idempotency_keys (created_at)
    WHERE recovery_point = 'finished';

-- An account's API keys; it may hold several (rotation: create the new
-- key, move the clients, revoke the old one), each revocable at once. Only
-- a key's SHA-256 is stored: every request reads its key by that hash
-- (the UNIQUE index), with its account, in the round trip it makes anyway.
-- prefix is the key's first characters, enough to recognise it in a
-- listing, too few to use it.
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

-- An account's keys in use, for its listing.
CREATE INDEX api_keys_account_active ON api_keys (account_id, created_at) WHERE revoked_at IS NULL;

-- The ledger: a charge, backed by a Stripe PaymentIntent. Its row is
-- written in the same batch as its idempotency record at every phase, and
-- outlives the record (retention sets idempotency_key_id to NULL). Its id
-- is derived from the record's (charges.ledgerID), a pure function of the
-- request like the record's.
--
-- stripe_payment_intent_id is the PaymentIntent the charge is;
-- stripe_charge_id is Stripe's charge of it (the PaymentIntent's latest
-- charge), which Stripe's charge and dispute events name. Both are set by
-- the finish, once Stripe answered.
--
-- capture_method manual: the request only authorized ("capture": false); a
-- capture request takes the money later. amount_capturable is what the
-- authorization still holds, amount_captured what was taken of it,
-- amount_refunded what refunds took back, counting refunds in flight. The
-- CHECKs make over-capturing and over-refunding impossible whatever the
-- code above them does. A capture or cancel in flight is pending_action,
-- with its idempotency record and, for a capture, the amount asked for
-- (NULL: all that is capturable); it is set in the capture's or cancel's
-- claim, guarded by version, so of a capture and a cancel racing exactly
-- one begins.
--
-- version increases with every change of the row. A write that follows a
-- read names the version read (IDS01 when it moved); an event records the
-- version of its object, so one object's events are ordered by it.
-- last_event_at is the Stripe event last applied, so that an older event
-- never overwrites a newer state (I8).
--
-- Row shape: fillfactor 80 leaves room on the page for the updates that
-- follow the insert. The finish sets the Stripe ids, which the partial
-- indexes below hold, so it is not a HOT update: it writes an entry into
-- each of the table's indexes. The alternative, no index on the charge
-- and the ids copied into a table of their own by a trigger, made the
-- finish HOT and measured the same throughput and PostgreSQL CPU
-- (BENCHMARKS.md, "Measured, then cut"): what the HOT update saved in
-- index work, the trigger's inserts spent. An update that changes neither
-- a Stripe id nor pending_record_id (a refund's reservation, most Stripe
-- events) is HOT while its page has room. The foreign keys are checked at
-- the insert only: an update that leaves their columns alone checks
-- nothing.
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
    stripe_payment_intent_id varchar(255),
    stripe_charge_id         varchar(255),
    -- The customer's next step of a payment that requires_action (the
    -- redirect of 3-D Secure).
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
    CONSTRAINT charges_pending_amount_check CHECK (pending_amount > 0 AND pending_amount <= amount)
) WITH (fillfactor = 80);

-- An account's charges newest first, for cursor pagination.
CREATE INDEX charges_account_created ON charges (account_id, created_at DESC, id DESC);

-- The charge of a capture or cancel in flight, by its record. Partial:
-- pending_record_id is NULL on nearly every charge, and a unique index
-- would take an entry for each NULL. It also serves the foreign key's ON
-- DELETE SET NULL (its lookup, pending_record_id = $1, implies IS NOT NULL).
CREATE UNIQUE INDEX charges_pending_record_id ON charges (pending_record_id)
    WHERE pending_record_id IS NOT NULL;

-- A Stripe event (or reconciliation) finds its charge by the Stripe ids it
-- names (ChargeFindForEvent). Partial: a charge has no Stripe id until its
-- finish.
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

-- Disputes of a charge, known only from Stripe's events. A dispute does not
-- change amount_refunded (Stripe does not count it as a refund), but a
-- charge with an open or lost dispute can no longer be refunded. Its status
-- is Stripe's vocabulary, so text with a CHECK.
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
    last_event_at     timestamptz NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now()
);

-- A charge's disputes (a refund checks them).
CREATE INDEX disputes_charge_id ON disputes (charge_id);

-- The inbox of Stripe events. Stripe delivers each event at least once, out
-- of order, sometimes days later; the event id is the key that makes its
-- effect happen once (I8). A row is inserted in the batch that claims the
-- event's idempotency record (so a 2xx is sent only once the event is
-- durably recorded), and processed_at is set in the batch that changes the
-- ledger, under WHERE processed_at IS NULL: the event id commits with the
-- ledger change it causes. The row outlives the record, so a redelivery
-- after the retention window still changes nothing.
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
    -- NULL until processed: applied; stale (older than the ledger's state);
    -- ignored (a type idempay does not handle); unknown_object (an object
    -- idempay never created: recorded and flagged, not applied); failed (its
    -- object does not decode as its type says, the reason in last_error).
    outcome            text CHECK (outcome IN ('applied', 'stale', 'ignored', 'unknown_object', 'failed')),
    received_at        timestamptz NOT NULL DEFAULT now(),
    processed_at       timestamptz,
    -- Processing attempts (failed ones and the one that succeeded), and the
    -- last failure.
    attempts           integer NOT NULL DEFAULT 0,
    last_error         text CHECK (char_length(last_error) <= 1000),
    CONSTRAINT stripe_events_processed_has_outcome CHECK ((processed_at IS NULL) = (outcome IS NULL))
);

-- Events received and not yet processed, oldest first.
CREATE INDEX stripe_events_unprocessed ON stripe_events (received_at) WHERE processed_at IS NULL;

-- Events out: what idempay settled, for other services. A row is inserted
-- in the batch that settles a charge or refund, whichever entry point
-- finished it: no event without its commit, no commit without its event
-- (I10). The relay publishes rows with published_at IS NULL to NATS
-- JetStream in seq order, with Nats-Msg-Id = id, then sets published_at; a
-- publish repeated after a crash is dropped by JetStream's duplicate
-- window. The same rows serve GET /v1/events and the webhooks to merchants.
--
-- object_version is the version of the charge or refund that the settling
-- batch's guarded update wrote: that row's lock lets one batch at a time
-- write a version, so a consumer may rely on the order of one object's
-- events by it. No unique index repeats that guarantee (one more index
-- entry per event); tests check every object's order. seq is an identity:
-- unique by construction, with no unique index either. object_id names a
-- charge or a refund, so it has no foreign key.
--
-- No row that all of an account's events write: the order is per object,
-- not per account, so one merchant's charges settle concurrently.
CREATE TABLE events (
    id             varchar(64) PRIMARY KEY DEFAULT idempay_ordered_id('evt_'),
    seq            bigint GENERATED ALWAYS AS IDENTITY,
    account_id     text NOT NULL,  -- no foreign key: see the rules above
    type           event_type NOT NULL,
    object_id      varchar(64) NOT NULL,
    object_version bigint NOT NULL CHECK (object_version > 0),
    -- The object as the API showed it when the event happened.
    data           json NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    published_at   timestamptz
);

-- The relay's scan: unpublished events in order.
CREATE INDEX events_unpublished ON events (seq) WHERE published_at IS NULL;
-- GET /v1/events pages an account's events newest first by seq.
CREATE INDEX events_account_seq ON events (account_id, seq DESC);
-- The webhook dispatcher reads events by seq. A BRIN index costs an insert
-- at the table's end nothing (its range is summarized later), unlike a
-- B-tree entry on every settling write.
CREATE INDEX events_seq_brin ON events USING brin (seq);

-- Webhooks out: idempay's events delivered to the merchants' endpoints
-- (docs/webhooks-out.md, I17). Nothing below is written on the request
-- path: a dispatcher reads committed events by seq and fans each one out
-- into one delivery per matching endpoint; workers in any process claim
-- due deliveries.
--
-- An endpoint of an account. An endpoint disabled by idempay (it answered
-- 410 Gone, or failed for longer than the configured time) is itself an
-- event (webhook_endpoint.disabled), sent to the account's other endpoints
-- that ask for it.
CREATE TABLE webhook_endpoints (
    id                  text PRIMARY KEY CHECK (char_length(id) <= 64)
        DEFAULT idempay_ordered_id('we_'),
    account_id          text NOT NULL REFERENCES accounts (id),
    url                 text NOT NULL CHECK (char_length(url) <= 2048),
    -- Event types wanted; '*' is every type.
    enabled_events      text[] NOT NULL CHECK (cardinality(enabled_events) BETWEEN 1 AND 32),
    enabled             boolean NOT NULL DEFAULT true,
    -- Why idempay disabled it ('gone': it answered 410; 'failing': it
    -- failed for longer than the configured time); NULL when enabled, or
    -- disabled by the merchant.
    disabled_reason     text CHECK (char_length(disabled_reason) <= 32),
    -- The signing secrets, sealed (AES-256-GCM under WEBHOOK_SECRETS_KEY,
    -- the endpoint's id as associated data): idempay must sign with them,
    -- so they cannot be hashed as API keys are; sealed, a copy of the
    -- database alone (a backup, a replica) does not give them away.
    secret              bytea NOT NULL CHECK (octet_length(secret) <= 128),
    -- During a rotation, the secret before, signed with as well until
    -- previous_expires_at.
    previous_secret     bytea CHECK (octet_length(previous_secret) <= 128),
    previous_expires_at timestamptz,
    -- Since when every attempt to it failed (NULL: its last attempt
    -- succeeded); it is disabled once that is longer than the configured
    -- time.
    failing_since       timestamptz,
    -- Increases with every change; orders its own events.
    version             bigint NOT NULL DEFAULT 1,
    -- The POST /v1/webhook_endpoints record that created it, for a resumed
    -- request.
    idempotency_key_id  text UNIQUE REFERENCES idempotency_keys (id) ON DELETE SET NULL,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now()
);

-- An account's endpoints, for its listing and for the dispatcher's fan-out.
CREATE INDEX webhook_endpoints_account ON webhook_endpoints (account_id, created_at);

-- One delivery per (event, endpoint): the dispatcher's fan-out is an
-- INSERT ... ON CONFLICT DO NOTHING, so a pass repeated after a crash
-- creates nothing twice. A delivery is pending until an attempt succeeds
-- (delivered) or the schedule ends (failed); a resend makes it pending
-- again, under the same event id. Deleting an endpoint deletes its
-- deliveries and their attempts.
--
-- What a delivery costs is what it writes: the fan-out's insert, the
-- worker's claim (lease_until, claims) and its outcome, and an attempt
-- row. event_id and account_id have no foreign key: the fan-out copies
-- them from the event row in the same statement, events and accounts are
-- never deleted, and a check per row would lock each event row (a WAL
-- record per event). fillfactor 70 leaves room on the page for the claim's
-- update, which changes no indexed column and so can stay on its page with
-- no new index entry (a HOT update) when the page has room; the outcome
-- changes state, which the partial indexes name, and is a new version with
-- its index entries.
CREATE TABLE webhook_deliveries (
    id              text PRIMARY KEY DEFAULT idempay_ordered_id('whd_'),
    event_id        text NOT NULL,  -- no foreign key: see above
    endpoint_id     text NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
    -- The event's account, object and version, read with the event by the
    -- fan-out: the deliveries API lists by account, and a delivery waits
    -- while an earlier version of its object is pending for the same
    -- endpoint.
    account_id      text NOT NULL,  -- no foreign key: see above
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
) WITH (fillfactor = 70);

-- The workers' scan: pending deliveries by due time.
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE state = 'pending';
-- Head of line per object: the lowest version pending for this endpoint.
-- Its predicate says "pending" as "neither delivered nor failed", and the
-- claim's check says it the same way, so that this index is the only one
-- that can answer the check (the planner cannot prove the due index's
-- "state = 'pending'" from it), whatever the statistics say
-- (WebhookDeliveryClaim).
CREATE INDEX webhook_deliveries_object ON webhook_deliveries (endpoint_id, object_id, object_version)
    WHERE state <> 'delivered' AND state <> 'failed';
-- GET /v1/webhook_endpoints/{id}/deliveries, newest first.
CREATE INDEX webhook_deliveries_endpoint ON webhook_deliveries (endpoint_id, id DESC);

-- Every attempt of a delivery: when it was due, when it ran, how the
-- endpoint answered.
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

-- The dispatcher's position in the events: every event with seq <= last_seq
-- has been fanned out, except the seqs in webhook_dispatch_gaps. One row.
--
-- seq is taken when an event is inserted and the event becomes visible when
-- its transaction commits, so a seq below one already read may still
-- commit: a gap. A gap is kept with the snapshot of the pass that saw it,
-- and resolved when its event appears, or when every transaction that was
-- running in that snapshot has ended: the gap's transaction was one of
-- them, since it took its seq before that snapshot and had its id before
-- it took its seq (a settling transaction writes its object, then its
-- event).
CREATE TABLE webhook_dispatcher (
    id       integer PRIMARY KEY CHECK (id = 1),
    last_seq bigint NOT NULL
);
INSERT INTO webhook_dispatcher (id, last_seq) VALUES (1, 0);

CREATE TABLE webhook_dispatch_gaps (
    seq           bigint PRIMARY KEY,
    seen_snapshot pg_snapshot NOT NULL
);
