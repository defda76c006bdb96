-- Fewer index entries per first request (BENCHMARKS.md, "Where PostgreSQL
-- spends"): every B-tree entry a first request writes costs CPU and WAL, and
-- a unique index stores an entry even for NULL.
--
-- pending_record_id is NULL on every charge except one with a capture or a
-- cancel in flight, so its unique index took an entry at every charge's
-- insert and another at every update that could not be HOT, for nothing. A
-- partial index keeps the uniqueness of the values that exist, and still
-- serves the foreign key's ON DELETE SET NULL (its lookup, pending_record_id
-- = $1, implies IS NOT NULL).
ALTER TABLE charges DROP CONSTRAINT charges_pending_record_id_key;
CREATE UNIQUE INDEX charges_pending_record_id ON charges (pending_record_id)
    WHERE pending_record_id IS NOT NULL;

-- Length limits as the column's type (varchar(n)) instead of CHECK
-- (char_length(x) <= n), on the tables a request writes. PostgreSQL reads a
-- table's CHECK constraints from their stored text, and plans them, at every
-- INSERT or UPDATE statement on the table (ExecRelCheck): a profile of the
-- server under first requests put a quarter of PostgreSQL's CPU in it, for a
-- charge's eighteen constraints and a record's eleven (BENCHMARKS.md, "Where
-- PostgreSQL spends"). A varchar(n) limit is checked where a value is
-- assigned, inside the statement's cached plan, and an UPDATE does not check
-- the columns it leaves alone. The limit is the same, and so is what it
-- defends; the error is 22001 (value too long) instead of 23514. The checks
-- that are not lengths (states, amounts, the finished record's response)
-- stay CHECKs.
ALTER TABLE idempotency_keys
    DROP CONSTRAINT idempotency_keys_id_check,
    DROP CONSTRAINT idempotency_keys_key_check,
    DROP CONSTRAINT idempotency_keys_last_error_check,
    DROP CONSTRAINT idempotency_keys_request_method_check,
    DROP CONSTRAINT idempotency_keys_request_route_check,
    DROP CONSTRAINT idempotency_keys_scope_length,
    ALTER COLUMN id TYPE varchar(64),
    ALTER COLUMN key TYPE varchar(255),
    ALTER COLUMN last_error TYPE varchar(1000),
    ALTER COLUMN request_method TYPE varchar(16),
    ALTER COLUMN request_route TYPE varchar(200),
    ALTER COLUMN scope TYPE varchar(100),
    ADD CONSTRAINT idempotency_keys_not_empty CHECK (key <> '' AND scope <> '');

ALTER TABLE charges
    DROP CONSTRAINT charges_id_check,
    DROP CONSTRAINT charges_payment_method_check,
    DROP CONSTRAINT charges_description_check,
    DROP CONSTRAINT charges_stripe_charge_id_check,
    DROP CONSTRAINT charges_failure_code_check,
    DROP CONSTRAINT charges_failure_message_check,
    DROP CONSTRAINT charges_stripe_payment_intent_id_check,
    DROP CONSTRAINT charges_next_action_url_check,
    ALTER COLUMN id TYPE varchar(64),
    ALTER COLUMN payment_method TYPE varchar(255),
    ALTER COLUMN description TYPE varchar(1000),
    ALTER COLUMN stripe_charge_id TYPE varchar(255),
    ALTER COLUMN failure_code TYPE varchar(255),
    ALTER COLUMN failure_message TYPE varchar(1000),
    ALTER COLUMN stripe_payment_intent_id TYPE varchar(255),
    ALTER COLUMN next_action_url TYPE varchar(2048),
    ADD CONSTRAINT charges_payment_method_not_empty CHECK (payment_method <> '');

ALTER TABLE refunds
    DROP CONSTRAINT refunds_id_check,
    DROP CONSTRAINT refunds_failure_code_check,
    DROP CONSTRAINT refunds_failure_message_check,
    DROP CONSTRAINT refunds_stripe_refund_id_check,
    ALTER COLUMN id TYPE varchar(64),
    ALTER COLUMN failure_code TYPE varchar(255),
    ALTER COLUMN failure_message TYPE varchar(1000),
    ALTER COLUMN stripe_refund_id TYPE varchar(255);

ALTER TABLE events
    DROP CONSTRAINT events_id_check,
    DROP CONSTRAINT events_object_id_check,
    ALTER COLUMN id TYPE varchar(64),
    ALTER COLUMN object_id TYPE varchar(64);

-- The Stripe ids a charge is known by (its PaymentIntent, and Stripe's
-- charge of it), in a table of their own instead of two partial indexes on
-- charges. Setting them on the charge, which every first request's finish
-- does, entered the partial indexes, and an update that changes an indexed
-- column cannot be HOT: PostgreSQL wrote a new entry into every index of
-- the table (five) for that one update. With no index on them, the finish
-- changes no indexed column of the charge, so it stays on its page as a HOT
-- update (the table's fillfactor leaves room) and touches no index; the
-- lookup table takes one small row and one index entry per id, once.
--
-- A trigger keeps it, so that no writer of the charge (the finish, Stripe's
-- events, a capture) can forget it: it runs only when an id is set or
-- changed (its WHEN clause), which is once per id and charge. Stripe's
-- events find their charge through it (ChargeFindForEvent).
CREATE TABLE charge_stripe_ids (
    stripe_id varchar(255) PRIMARY KEY,
    -- No foreign key: the row is written by the statement that writes the
    -- charge's id into the charge, and a foreign key's check is one more
    -- query (and a row lock) per insert.
    charge_id varchar(64) NOT NULL
);

INSERT INTO charge_stripe_ids (stripe_id, charge_id)
SELECT stripe_payment_intent_id, id FROM charges WHERE stripe_payment_intent_id IS NOT NULL
UNION
SELECT stripe_charge_id, id FROM charges WHERE stripe_charge_id IS NOT NULL
ON CONFLICT DO NOTHING;

DROP INDEX charges_stripe_payment_intent_id;
DROP INDEX charges_stripe_charge_id;

CREATE FUNCTION idempay_charge_stripe_ids() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.stripe_payment_intent_id IS NOT NULL
       AND (TG_OP = 'INSERT' OR NEW.stripe_payment_intent_id IS DISTINCT FROM OLD.stripe_payment_intent_id) THEN
        INSERT INTO charge_stripe_ids (stripe_id, charge_id) VALUES (NEW.stripe_payment_intent_id, NEW.id)
        ON CONFLICT DO NOTHING;
    END IF;
    IF NEW.stripe_charge_id IS NOT NULL
       AND (TG_OP = 'INSERT' OR NEW.stripe_charge_id IS DISTINCT FROM OLD.stripe_charge_id) THEN
        INSERT INTO charge_stripe_ids (stripe_id, charge_id) VALUES (NEW.stripe_charge_id, NEW.id)
        ON CONFLICT DO NOTHING;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER charges_stripe_ids_insert AFTER INSERT ON charges FOR EACH ROW
    WHEN (NEW.stripe_payment_intent_id IS NOT NULL OR NEW.stripe_charge_id IS NOT NULL)
    EXECUTE FUNCTION idempay_charge_stripe_ids();
CREATE TRIGGER charges_stripe_ids_update AFTER UPDATE OF stripe_payment_intent_id, stripe_charge_id ON charges FOR EACH ROW
    WHEN (NEW.stripe_payment_intent_id IS DISTINCT FROM OLD.stripe_payment_intent_id
          OR NEW.stripe_charge_id IS DISTINCT FROM OLD.stripe_charge_id)
    EXECUTE FUNCTION idempay_charge_stripe_ids();
