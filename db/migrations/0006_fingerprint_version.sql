-- The definition a record's request_fingerprint was computed with:
-- 1, SHA-256 over method, path and encoding/json's canonical form of the
-- body as sent; 2, SHA-256 over a tag, method, path and the RFC 8785 form
-- of the normalised request (README, "The fingerprint"). Records stored
-- before this migration are version 1 and are compared with their own
-- definition until retention removes them; new records are version 2.
ALTER TABLE idempotency_keys
    ADD COLUMN fingerprint_version smallint NOT NULL DEFAULT 1 CHECK (fingerprint_version IN (1, 2));
ALTER TABLE idempotency_keys ALTER COLUMN fingerprint_version SET DEFAULT 2;
