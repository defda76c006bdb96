package accounts

// SetBeforeForget makes a's listener run f before it applies each
// invalidation: a slow process, to show that the sender waits for it.
func SetBeforeForget(a *Authenticator, f func()) { a.beforeForget = f }
