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
    stripe_id text PRIMARY KEY CHECK (char_length(stripe_id) <= 255),
    charge_id text NOT NULL REFERENCES charges (id) ON DELETE CASCADE
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
