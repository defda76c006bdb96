-- One path through the idempotency core, and that path cheap (BENCHMARKS.md,
-- "Where PostgreSQL spends").
--
-- 1. Every phase is one pipelined batch that PostgreSQL runs as one implicit
--    transaction: the core's own statement first, then the operation's
--    writes. A statement that must match a row and does not raises an error
--    inside the batch, so nothing of the batch commits. idempay_expect is
--    that guard: the core fences its phase writes with SQLSTATE IDF01
--    (fenced: the record was taken over), and an operation guards the rows it
--    read before the phase with IDS01 (stale: the row changed since it was
--    read; the runner runs the step again).
CREATE FUNCTION idempay_expect(matched bigint, sqlstate text, what text) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    IF matched = 0 THEN
        RAISE EXCEPTION 'idempay: %', what USING ERRCODE = sqlstate;
    END IF;
    RETURN matched;
END
$$;

-- 2. No row that all of an account's requests write. Events were numbered
--    per account from accounts.event_seq, so every settling transaction of
--    an account updated that one row and held its lock until its commit was
--    flushed: one merchant's charges settled one commit at a time. Events are
--    now ordered per object: the object's own row carries a version, bumped
--    in the same UPDATE that changes it, and the event records the version it
--    describes. A consumer may rely on the order of one object's events
--    (object_version) and on each event once by id; the global seq orders the
--    relay and the API's pages.
ALTER TABLE charges ADD COLUMN version bigint NOT NULL DEFAULT 1 CHECK (version > 0);
ALTER TABLE refunds ADD COLUMN version bigint NOT NULL DEFAULT 1 CHECK (version > 0);

ALTER TABLE events
    DROP CONSTRAINT events_account_seq_unique,
    DROP COLUMN account_seq,
    ADD COLUMN object_version bigint CHECK (object_version > 0);
-- Events written before this migration are numbered per object in the
-- order they were written.
UPDATE events SET object_version = v.n
FROM (SELECT id, row_number() OVER (PARTITION BY object_id ORDER BY seq) AS n FROM events) v
WHERE events.id = v.id;
ALTER TABLE events
    ALTER COLUMN object_version SET NOT NULL,
    ADD CONSTRAINT events_object_version_unique UNIQUE (object_id, object_version);
ALTER TABLE accounts DROP COLUMN event_seq;

-- GET /v1/events pages an account's events newest first by seq.
CREATE INDEX events_account_seq ON events (account_id, seq DESC);

-- 3. Foreign keys that lock a shared parent row. An insert into a table
--    with a foreign key to accounts locks the account's row FOR KEY SHARE
--    until commit; many concurrent transactions of one account sharing that
--    lock turn it into a MultiXact, which PostgreSQL makes expensive (three
--    such checks per first request). Accounts are never deleted, and every
--    account_id on these tables comes from an authenticated account (or, for
--    an event, from the ledger row it describes), so the application keeps
--    what the foreign key kept. The foreign keys between a record and its
--    ledger rows stay: their parent row is the transaction's own.
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_account_id_fkey;
ALTER TABLE charges DROP CONSTRAINT charges_account_id_fkey;
ALTER TABLE refunds DROP CONSTRAINT refunds_account_id_fkey;
ALTER TABLE events DROP CONSTRAINT events_account_id_fkey;

-- 4. The version-1 fingerprint is gone: a template has no installed records
--    to stay compatible with.
ALTER TABLE idempotency_keys DROP COLUMN fingerprint_version;

-- 5. Room on each page for the update that follows every insert (the
--    finish), so that it can stay on the page (a HOT update where no indexed
--    column changes) instead of moving the row to another.
ALTER TABLE idempotency_keys SET (fillfactor = 80);
ALTER TABLE charges SET (fillfactor = 80);
