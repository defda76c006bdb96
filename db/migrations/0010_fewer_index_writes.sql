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
