-- The inbox of Stripe events. Stripe delivers each event at least once, out
-- of order, sometimes days later; the event id is the key that makes its
-- effect happen once (I8). A row is inserted in the transaction that claims
-- the event's idempotency record (so a 2xx is sent only once the event is
-- durably recorded), and processed_at is set in the transaction that
-- changes the ledger, under a WHERE processed_at IS NULL: the event id
-- commits with the ledger change it causes. The row outlives the
-- idempotency record, so a redelivery after the retention window still
-- changes nothing.
CREATE TABLE stripe_events (
    id                 text PRIMARY KEY CHECK (char_length(id) BETWEEN 1 AND 255),
    type               text NOT NULL CHECK (char_length(type) BETWEEN 1 AND 100),
    api_version        text CHECK (char_length(api_version) <= 20),
    -- data.object.id: the charge, refund or dispute at Stripe.
    object_id          text CHECK (char_length(object_id) <= 255),
    -- Stripe's created time of the event: what orders events, never arrival.
    stripe_created     timestamptz NOT NULL,
    -- The verified event as received, for processing (also by the completer)
    -- and for audit.
    payload            jsonb NOT NULL,
    idempotency_key_id text UNIQUE REFERENCES idempotency_keys (id) ON DELETE SET NULL,
    -- NULL until processed: applied, stale (older than the ledger's state),
    -- ignored (a type idempay does not handle) or unknown_object (an object
    -- idempay never created: recorded and flagged, not applied).
    outcome            text CHECK (outcome IN ('applied', 'stale', 'ignored', 'unknown_object')),
    received_at        timestamptz NOT NULL DEFAULT now(),
    processed_at       timestamptz,
    -- Processing attempts (failed ones and the one that succeeded), and the
    -- last failure.
    attempts           integer NOT NULL DEFAULT 0,
    last_error         text CHECK (char_length(last_error) <= 1000),
    CONSTRAINT stripe_events_processed_has_outcome CHECK ((processed_at IS NULL) = (outcome IS NULL))
);

CREATE INDEX stripe_events_unprocessed ON stripe_events (received_at) WHERE processed_at IS NULL;

-- The Stripe event last applied to a ledger row, so that an older event
-- never overwrites a newer state (I8): states only move forward, and within
-- one state a later event wins.
ALTER TABLE charges ADD COLUMN last_event_at timestamptz;
ALTER TABLE refunds ADD COLUMN last_event_at timestamptz;

CREATE INDEX charges_stripe_charge_id ON charges (stripe_charge_id) WHERE stripe_charge_id IS NOT NULL;
CREATE INDEX refunds_stripe_refund_id ON refunds (stripe_refund_id) WHERE stripe_refund_id IS NOT NULL;

-- Disputes of a charge, known only from Stripe's events. A dispute does not
-- change amount_refunded (Stripe does not count it as a refund), but a charge
-- with an open or lost dispute can no longer be refunded.
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

CREATE INDEX disputes_charge_id ON disputes (charge_id);
