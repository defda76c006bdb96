-- Ids that grow with time for the rows a first request inserts besides its
-- record (charges, refunds and events; the server makes charge and refund
-- ids the same way, in charges.newID): an insert then lands at the right
-- edge of the primary key's index instead of on a random page, so a first
-- request touches fewer index pages, and writes fewer full-page images to
-- the WAL after each checkpoint (BENCHMARKS.md, "Where PostgreSQL
-- spends"). The time in them is only an order: nothing reads it, and none
-- of them is sent to Stripe (the record id, which is, stays a pure function
-- of the request).
CREATE FUNCTION idempay_ordered_id(prefix text) RETURNS text
LANGUAGE sql VOLATILE AS $$
    SELECT prefix
        || lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0')
        || substr(replace(gen_random_uuid()::text, '-', ''), 1, 20)
$$;

ALTER TABLE charges ALTER COLUMN id SET DEFAULT idempay_ordered_id('ch_');
ALTER TABLE refunds ALTER COLUMN id SET DEFAULT idempay_ordered_id('re_');
ALTER TABLE events ALTER COLUMN id SET DEFAULT idempay_ordered_id('evt_');

-- seq is an identity column (GENERATED ALWAYS): unique by construction. Its
-- UNIQUE constraint was one more index to write per event; the relay's and
-- the API's scans use the partial and the per-account indexes.
ALTER TABLE events DROP CONSTRAINT events_seq_key;

-- The same for the (object_id, object_version) UNIQUE constraint: the
-- version is the one the settling batch's guarded update of the object
-- wrote, and that row's lock lets one batch at a time write a version, so
-- two events of one object cannot carry one version. Tests check the order
-- of every object's events (eventstest.ReadAll); an index would only repeat
-- it, at one more index insert per event.
ALTER TABLE events DROP CONSTRAINT events_object_version_unique;
