package console

import "net/http"

// ResendAfterSessionCheck serves r, a Resend form's POST, in the two steps
// the console's handler takes (signedIn, then resend), and runs between
// after the session check and before the resend and its claim: a test
// revokes the session's key there, as another process could at that
// moment. It returns the session check's error, if it refused r.
func (c *Console) ResendAfterSessionCheck(w http.ResponseWriter, r *http.Request, between func()) error {
	v, err := c.account(r)
	if err != nil {
		return err
	}
	between()
	c.resend(w, r, v)
	return nil
}
