package chargeshttp

import (
	"context"
	"crypto/rand"

	"github.com/labstack/echo/v4"

	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/accounts/accountshttp"
	"github.com/idempay/idempay/internal/charges"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/idempotency/idemhttp"
)

// This file is a product option, off the straight path: an account's
// idempotency mode, which lets an existing API adopt keys account by
// account (docs/api.md, "Rollout"). A reader of a POST can skip it: for an
// account in required mode, every new account's, rollout is post.
//
// The modes apply to POST /v1/charges and /v1/refunds only, the routes that
// clients called without keys before idempotency came, and that a rollout
// must keep working for them. Capture and cancel came with keys: no client
// ever called them without one, and a capture that a made-up key leaves
// undeduplicated, or that shadow mode runs again, is the double capture the
// key exists to prevent; they always require one (they call post).

// rollout is post under the account's idempotency mode. required: post, which
// refuses a request without a key. optional and shadow: a request without a
// key runs unprotected, under a key the server makes up (so it still has a
// record and a ledger row, and is never deduplicated), and is counted.
// shadow, with a key: post, whose request is checked against the record
// first (shadow).
func (h *Handler) rollout(c echo.Context, route string, command command) error {
	acct := accountshttp.FromContext(c)
	if acct.Mode == accounts.ModeRequired {
		return h.post(c, route, command)
	}
	header := c.Request().Header
	_, keyed, err := idemhttp.Key(header)
	if err != nil {
		return err
	}
	switch {
	case !keyed:
		h.count(acct.Mode, "unkeyed")
		header.Set(idemhttp.HeaderKey, serverKey("unkeyed_"))
		return h.post(c, route, command)
	case acct.Mode == accounts.ModeShadow:
		return h.post(c, route, h.shadow(c.Request().Context(), acct, command))
	default:
		return h.post(c, route, command)
	}
}

// shadow is command, then the shadow mode's part: a key is recorded the
// first time; a request that would have been replayed, refused as a
// mismatch, as in flight or as expired runs again as before, under a key
// of its own, and is counted and logged as what enforcing would have
// changed. It peeks after the command because the fingerprint that tells a
// replay from a mismatch covers the validated, normalised body.
func (h *Handler) shadow(ctx context.Context, acct accounts.Account, command command) command {
	return func(accountID string, req idempotency.Request) (*charges.Command, error) {
		cmd, err := command(accountID, req)
		if err != nil {
			return nil, err
		}
		would, err := h.svc.Peek(ctx, cmd)
		if err != nil {
			return nil, err
		}
		if would != idempotency.OutcomeNew {
			h.count(acct.Mode, "would_"+string(would))
			h.log.WarnContext(ctx, "shadow mode: idempotency would have changed this request; it runs as before",
				"account_id", acct.ID, "would", string(would))
			cmd.Request.Key = serverKey("shadow_")
		}
		return cmd, nil
	}
}

// count notes what the account's mode did to a request (OnRollout).
func (h *Handler) count(mode, outcome string) {
	if h.OnRollout != nil {
		h.OnRollout(mode, outcome)
	}
}

// serverKey is a key the server makes for a request that has none of its
// own: unique, so the request is never deduplicated.
func serverKey(prefix string) string {
	return prefix + rand.Text()
}
