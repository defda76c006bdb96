-- name: ChargeLockForRefund :exec
-- Locks the charge row, in a refund's claim batch before any write of the
-- refund's (after the claim's own INSERT and its bounded lock wait,
-- IdempotencyKeyLockWait), so that concurrent
-- refunds of one charge (each with its own key) queue on the row instead of
-- failing a version guard one after another. Once the lock is held, the
-- next statement's snapshot sees every change committed to the charge
-- before it (other refunds, a dispute's ChargeTouch).
SELECT 1 FROM charges WHERE id = @id FOR NO KEY UPDATE;

-- name: ChargeReserveRefund :exec
-- Reserves a refund's amount on the charge, in the refund's claim batch,
-- after ChargeLockForRefund. Guarded by what a refund needs, checked on the
-- charge as it is now, not on the version the refund's checks read: the
-- charge succeeded, has no dispute that forbids a refund (allows_refund:
-- ChargeGetForRefund; unless @made_at_stripe: a refund that Stripe made
-- already, re-created by reconciliation, which a dispute opened since does
-- not undo), and still has the amount left to refund: of what
-- was captured, less idempay's reservations. Stripe's figure
-- (stripe_amount_refunded) is not a limit here: it may count this very
-- request's refund, lost to a restore, whose retry must reach Stripe (I13),
-- and Stripe refuses a refund beyond what it holds. When one of them no
-- longer holds it raises IDS01, and the runner reads and checks again,
-- which answers with what changed (for example refund-exceeds-charge). The table's CHECK rejects any amount that would
-- exceed the charge whatever the checks said.
WITH c AS (
    UPDATE charges
    SET amount_refunded = amount_refunded + @amount, version = version + 1, updated_at = now()
    WHERE charges.id = @id
      AND charges.status = 'succeeded'
      AND charges.amount_captured - charges.amount_refunded >= @amount
      AND (@made_at_stripe::boolean OR NOT EXISTS (SELECT 1 FROM disputes d WHERE d.charge_id = charges.id AND NOT d.allows_refund))
    RETURNING 1
)
SELECT idempay_expect((SELECT count(*) FROM c), 'IDS01', 'the charge can no longer be refunded by this amount');

-- name: ChargeReleaseRefunded :exec
-- Releases a refund that failed at Stripe after it was reserved (or
-- succeeded), or that Stripe refused. A failure Stripe reported at
-- @failed_at (NULL when Stripe refused it: it never counted it) also moves
-- Stripe's figure, when that is older: the figure loses the refund's
-- amount if it was reported at or after Stripe made the refund
-- (@refund_created_at, in whole seconds, as Stripe stamps its events), so
-- it counted the refund; and
-- stripe_refunded_at becomes @failed_at, so that an older charge event,
-- delivered late, no longer counts it again.
UPDATE charges
SET amount_refunded = GREATEST(0, amount_refunded - @amount::bigint),
    stripe_amount_refunded = CASE
        WHEN stripe_refunded_at < sqlc.narg(failed_at)::timestamptz
         AND stripe_refunded_at >= date_trunc('second', @refund_created_at::timestamptz)
        THEN GREATEST(0, stripe_amount_refunded - @amount::bigint)
        ELSE stripe_amount_refunded END,
    stripe_refunded_at = GREATEST(stripe_refunded_at, sqlc.narg(failed_at)::timestamptz),
    version = version + 1, updated_at = now()
WHERE id = @id;

-- name: ChargeGetForRefund :one
-- What a refund checks, in one read before its claim: the charge, how many
-- of its disputes forbid a refund, and whether the refund's own ledger row
-- exists (the same request ran before its record expired: RefundInsert
-- refuses it, whatever the charge's state is now). Whether a dispute
-- forbids a refund (a chargeback, open or lost, does; an inquiry does not,
-- unless Stripe says the charge is not refundable) was decided when it was
-- stored: allows_refund (the disputes table).
SELECT sqlc.embed(charges),
       (SELECT count(*) FROM disputes d WHERE d.charge_id = charges.id AND NOT d.allows_refund) AS blocking_disputes,
       EXISTS (SELECT 1 FROM refunds r WHERE r.id = @refund_id) AS refund_exists
FROM charges WHERE charges.account_id = @account_id AND charges.id = @id;
