-- idempay's own state vocabularies as enum types instead of CHECK (x IN
-- (...)) constraints: a charge's status, capture method and pending action,
-- a refund's status, an event's type and a record's recovery point.
--
-- PostgreSQL keeps a table's CHECK constraints as stored expression trees
-- and, at every INSERT or UPDATE statement, reads them back from their text,
-- plans and compiles every one of them again (ExecRelCheck), whichever
-- columns the statement sets. An IN list is the longest of those texts: its
-- array constant is stored byte by byte. Measured on the raw first-request
-- SQL (BENCHMARKS.md, "CHECK constraints, measured one by one"): dropping
-- these five lists alone took about a tenth of PostgreSQL's CPU per first
-- request; moving them to domains kept about half of that cost, because a
-- domain's check is compiled into every statement that assigns the column.
-- An enum is checked once, when a value is read in (an unknown label is
-- 22P02, invalid input), and costs nothing afterwards; it is also stored in
-- four bytes instead of the label's text.
--
-- The rule kept here: a vocabulary that idempay owns is an enum (adding a
-- value is ALTER TYPE ... ADD VALUE in a migration of its own); one that
-- Stripe owns (a dispute's status) stays text with a CHECK, because Stripe
-- may add values and a template should not fail a webhook for that. The
-- checks that relate columns (amounts, the finished record's response, the
-- scope) stay CHECKs: no type can say them.
--
-- Go sees the labels as strings (sqlc.yaml's overrides); pgx sends a string
-- for a type it does not know in text form, which is what an enum reads.
--
-- Changing a column's type rewrites its table under an exclusive lock. A
-- template's tables are small; on a large installed base, run this in a
-- maintenance window, or add the enum column beside the text one, backfill
-- it in batches and swap them.

CREATE TYPE charge_status AS ENUM (
    'processing', 'requires_action', 'requires_capture', 'pending', 'succeeded', 'failed', 'canceled');
CREATE TYPE charge_capture_method AS ENUM ('automatic', 'manual');
CREATE TYPE charge_pending_action AS ENUM ('capture', 'cancel');
CREATE TYPE refund_status AS ENUM ('processing', 'pending', 'succeeded', 'failed');
CREATE TYPE event_type AS ENUM (
    'charge.succeeded', 'charge.failed', 'charge.requires_capture', 'charge.canceled',
    'refund.succeeded', 'refund.failed');
CREATE TYPE recovery_point AS ENUM ('started', 'downstream_called', 'finished');

ALTER TABLE charges
    DROP CONSTRAINT charges_status_check,
    DROP CONSTRAINT charges_capture_method_check,
    DROP CONSTRAINT charges_pending_action_check,
    ALTER COLUMN status DROP DEFAULT,
    ALTER COLUMN capture_method DROP DEFAULT;
ALTER TABLE charges
    ALTER COLUMN status TYPE charge_status USING status::charge_status,
    ALTER COLUMN capture_method TYPE charge_capture_method USING capture_method::charge_capture_method,
    ALTER COLUMN pending_action TYPE charge_pending_action USING pending_action::charge_pending_action,
    ALTER COLUMN status SET DEFAULT 'processing',
    ALTER COLUMN capture_method SET DEFAULT 'automatic';

ALTER TABLE refunds
    DROP CONSTRAINT refunds_status_check,
    ALTER COLUMN status DROP DEFAULT;
ALTER TABLE refunds
    ALTER COLUMN status TYPE refund_status USING status::refund_status,
    ALTER COLUMN status SET DEFAULT 'processing';

ALTER TABLE events
    DROP CONSTRAINT events_type_check,
    ALTER COLUMN type TYPE event_type USING type::event_type;

-- The two partial indexes name the recovery point in their predicates
-- ('finished'::text), which an enum column cannot compare with: they are
-- built again on the new type, with the same definitions.
DROP INDEX idempotency_keys_unfinished_next_attempt;
DROP INDEX idempotency_keys_finished_created;
ALTER TABLE idempotency_keys
    DROP CONSTRAINT idempotency_keys_recovery_point_check,
    DROP CONSTRAINT idempotency_keys_finished_has_response,
    ALTER COLUMN recovery_point DROP DEFAULT;
ALTER TABLE idempotency_keys
    ALTER COLUMN recovery_point TYPE recovery_point USING recovery_point::recovery_point,
    ALTER COLUMN recovery_point SET DEFAULT 'started',
    ADD CONSTRAINT idempotency_keys_finished_has_response
        CHECK ((recovery_point = 'finished') = (response_status IS NOT NULL AND finished_at IS NOT NULL));
CREATE INDEX idempotency_keys_unfinished_next_attempt ON idempotency_keys (next_attempt_at)
    WHERE recovery_point <> 'finished';
CREATE INDEX idempotency_keys_finished_created ON idempotency_keys (created_at)
    WHERE recovery_point = 'finished';
