-- Charges are backed by Stripe PaymentIntents: authorize now, capture later,
-- cancel, and payments that wait for the customer (3-D Secure).
--
-- stripe_payment_intent_id is the PaymentIntent the charge is; stripe_charge_id
-- keeps Stripe's charge of it (the PaymentIntent's latest charge), which
-- Stripe's charge and dispute events name.
ALTER TABLE charges
    ADD COLUMN stripe_payment_intent_id text CHECK (char_length(stripe_payment_intent_id) <= 255),
    -- manual: the request authorized only ("capture": false); a capture
    -- request takes the money later. Part of what is sent to Stripe, so kept
    -- for a resumed request.
    ADD COLUMN capture_method text NOT NULL DEFAULT 'automatic' CHECK (capture_method IN ('automatic', 'manual')),
    -- What the authorization still holds (requires_capture), and what was
    -- captured of it. The sum captured never exceeds what was authorized;
    -- refunds never exceed what was captured.
    ADD COLUMN amount_capturable bigint NOT NULL DEFAULT 0 CHECK (amount_capturable >= 0 AND amount_capturable <= amount),
    ADD COLUMN amount_captured bigint NOT NULL DEFAULT 0 CHECK (amount_captured >= 0 AND amount_captured <= amount),
    -- The customer's next step of a payment that requires_action (the
    -- redirect of 3-D Secure).
    ADD COLUMN next_action_url text CHECK (char_length(next_action_url) <= 2048),
    -- A capture or cancel in flight: its idempotency record and, for a
    -- capture, the amount asked for (NULL: all that is capturable). Set in
    -- the capture's or cancel's claim batch, guarded by the charge's version,
    -- so of a capture and a cancel racing exactly one is begun; cleared by
    -- its finish (or by the Stripe event that settled it first).
    ADD COLUMN pending_action text CHECK (pending_action IN ('capture', 'cancel')),
    ADD COLUMN pending_record_id text UNIQUE REFERENCES idempotency_keys (id) ON DELETE SET NULL,
    ADD COLUMN pending_amount bigint CHECK (pending_amount > 0 AND pending_amount <= amount);

-- Charges that succeeded before this migration captured all they authorized.
UPDATE charges SET amount_captured = amount WHERE status = 'succeeded';

ALTER TABLE charges
    DROP CONSTRAINT charges_status_check,
    ADD CONSTRAINT charges_status_check CHECK (status IN
        ('processing', 'requires_action', 'requires_capture', 'pending', 'succeeded', 'failed', 'canceled')),
    DROP CONSTRAINT charges_check,
    ADD CONSTRAINT charges_amount_refunded_check CHECK (amount_refunded >= 0 AND amount_refunded <= amount_captured);

CREATE INDEX charges_stripe_payment_intent_id ON charges (stripe_payment_intent_id)
    WHERE stripe_payment_intent_id IS NOT NULL;

ALTER TABLE events
    DROP CONSTRAINT events_type_check,
    ADD CONSTRAINT events_type_check CHECK (type IN ('charge.succeeded', 'charge.failed',
        'charge.requires_capture', 'charge.canceled', 'refund.succeeded', 'refund.failed'));
