package accounts

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/dbsqlc"
)

// DefaultCacheTTL is how long a valid API key is remembered (AUTH_CACHE_TTL).
const DefaultCacheTTL = 10 * time.Second

// maxCachedKeys bounds the authentication cache; when it is full it is
// emptied, which costs one database read per key on the next request.
const maxCachedKeys = 10_000

// The channel on which a process that revokes a key, or changes an account,
// tells every process's authenticator to forget what it remembers of it;
// and the channel on which each process acknowledges a message once it has
// applied it, so that the revoking process can wait for all of them.
const (
	authChannel    = "idempay_auth"
	ackChannel     = "idempay_auth_ack"
	keyRevoked     = "key:"     // + the key hash in hex
	accountChanged = "account:" // + the account id
)

// listenStatement is the one statement a listening connection runs; its
// text identifies the listeners in pg_stat_activity, which is how the
// revoking process knows how many acknowledgements to wait for.
const listenStatement = "LISTEN " + authChannel + "; LISTEN " + ackChannel

// notify queues the invalidation msg in tx: PostgreSQL delivers it to every
// listener when, and only if, tx commits.
func notify(ctx context.Context, tx dbsqlc.DBTX, msg string) error {
	if _, err := tx.Exec(ctx, "SELECT pg_notify($1, $2)", authChannel, msg); err != nil {
		return fmt.Errorf("notifying %s: %w", authChannel, err)
	}
	return nil
}

// Authenticator checks API keys. It remembers each valid key for a short TTL,
// so that a request's authentication usually costs no database round trip
// and a replay is the one indexed read of its record. Once Listen runs, it
// remembers keys only while it is subscribed to the invalidation channel, so
// a revocation or a mode change applies on its next request in every
// process; without Listen (tests, tools) the TTL bounds how long a removed
// key keeps working. Unknown keys are never cached, so a new key works at
// once and a wrong key is always checked against the database.
type Authenticator struct {
	db  dbsqlc.DBTX
	ttl time.Duration

	// listened is set once Listen has been called; from then on the cache
	// is used only while subscribed is true.
	listened   atomic.Bool
	subscribed atomic.Bool

	mu    sync.Mutex
	cache map[[sha256.Size]byte]cachedAccount
	// pool is the listener's pool (set by Listen): acknowledgements go out
	// on it.
	pool *pgxpool.Pool
	// acks counts, per message this process awaits, the processes that
	// acknowledged it; arrived is signalled at each acknowledgement.
	acks    map[string]int
	arrived *sync.Cond
}

type cachedAccount struct {
	acct  Account
	until time.Time
}

// NewAuthenticator returns an Authenticator over db; ttl 0 turns the cache off.
func NewAuthenticator(db dbsqlc.DBTX, ttl time.Duration) *Authenticator {
	a := &Authenticator{db: db, ttl: ttl, cache: map[[sha256.Size]byte]cachedAccount{}, acks: map[string]int{}}
	a.arrived = sync.NewCond(&a.mu)
	return a
}

func (a *Authenticator) caching() bool {
	return a.ttl > 0 && (!a.listened.Load() || a.subscribed.Load())
}

// Authenticate returns the account that owns key (with the key's id), or
// db.ErrNotFound for an unknown or revoked key.
func (a *Authenticator) Authenticate(ctx context.Context, key string) (Account, error) {
	hash := hashKey(key)
	now := time.Now()
	caching := a.caching()
	if caching {
		a.mu.Lock()
		c, ok := a.cache[hash]
		a.mu.Unlock()
		if ok && now.Before(c.until) {
			return c.acct, nil
		}
	}
	row, err := dbsqlc.New().APIKeyAuthenticate(ctx, a.db, hash[:])
	if err != nil {
		return Account{}, db.NotFound(err)
	}
	acct := Account{ID: row.ID, Name: row.Name, CreatedAt: row.CreatedAt, Mode: row.IdempotencyMode, KeyID: row.KeyID}
	if caching {
		a.mu.Lock()
		if len(a.cache) >= maxCachedKeys {
			clear(a.cache)
		}
		a.cache[hash] = cachedAccount{acct: acct, until: now.Add(a.ttl)}
		a.mu.Unlock()
	}
	return acct, nil
}

// forget applies one invalidation message.
func (a *Authenticator) forget(msg string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case strings.HasPrefix(msg, keyRevoked):
		b, err := hex.DecodeString(strings.TrimPrefix(msg, keyRevoked))
		if err == nil && len(b) == sha256.Size {
			delete(a.cache, [sha256.Size]byte(b))
			return
		}
		clear(a.cache)
	case strings.HasPrefix(msg, accountChanged):
		id := strings.TrimPrefix(msg, accountChanged)
		for h, c := range a.cache {
			if c.acct.ID == id {
				delete(a.cache, h)
			}
		}
	default:
		clear(a.cache)
	}
}

// ExpectRevocation prepares the process that is about to commit the
// revocation of the key whose hash is keyHash: call it before the commit,
// then await after it (or cancel if it did not commit). await forgets the
// key here at once, then waits until every listening process (those whose
// listening connection pg_stat_activity shows) has acknowledged applying
// the revocation, for at most a second: so the DELETE answers only once the
// key is refused everywhere (I11), and a wedged process cannot hold it up
// for long. Without a listener here it does not wait.
func (a *Authenticator) ExpectRevocation(keyHash []byte) (await func(context.Context), cancel func()) {
	msg := keyRevoked + hex.EncodeToString(keyHash)
	a.mu.Lock()
	a.acks[msg] = 0
	a.mu.Unlock()
	cancel = func() {
		a.mu.Lock()
		delete(a.acks, msg)
		a.mu.Unlock()
	}
	await = func(ctx context.Context) {
		a.mu.Lock()
		delete(a.cache, [sha256.Size]byte(keyHash))
		pool := a.pool
		a.mu.Unlock()
		if !a.subscribed.Load() || pool == nil {
			return
		}
		var listeners int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND query = $1`, listenStatement).Scan(&listeners); err != nil {
			return
		}
		deadline := time.Now().Add(time.Second)
		stop := context.AfterFunc(ctx, func() { a.mu.Lock(); a.arrived.Broadcast(); a.mu.Unlock() })
		defer stop()
		timer := time.AfterFunc(time.Second, func() { a.mu.Lock(); a.arrived.Broadcast(); a.mu.Unlock() })
		defer timer.Stop()
		a.mu.Lock()
		defer a.mu.Unlock()
		for a.acks[msg] < listeners && time.Now().Before(deadline) && ctx.Err() == nil {
			a.arrived.Wait()
		}
	}
	return await, cancel
}

// Listen subscribes to the invalidation channel on a connection of its own
// and applies every message until ctx is done. While it is not subscribed
// (before the first LISTEN, after a lost connection) the cache is not used,
// so no process trusts a key it may have missed the revocation of.
func (a *Authenticator) Listen(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) {
	a.mu.Lock()
	a.pool = pool
	a.mu.Unlock()
	a.listened.Store(true)
	for ctx.Err() == nil {
		err := a.listenOnce(ctx, pool, log)
		a.subscribed.Store(false)
		a.mu.Lock()
		clear(a.cache)
		a.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		log.WarnContext(ctx, "auth cache: lost its invalidation channel; every request checks the database until it is back", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (a *Authenticator) listenOnce(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) error {
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// A listening connection goes back to no other user: it leaves the pool.
	conn := pc.Hijack()
	defer conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck
	if _, err := conn.PgConn().Exec(ctx, listenStatement).ReadAll(); err != nil {
		return err
	}
	a.mu.Lock()
	clear(a.cache) // anything revoked before the LISTEN is forgotten too
	a.mu.Unlock()
	a.subscribed.Store(true)
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		switch n.Channel {
		case authChannel:
			a.forget(n.Payload)
			// Acknowledge on another connection: this one only listens.
			go func(msg string) {
				if _, err := pool.Exec(context.WithoutCancel(ctx), "SELECT pg_notify($1, $2)", ackChannel, msg); err != nil {
					log.WarnContext(ctx, "auth cache: acknowledging an invalidation", "err", err)
				}
			}(n.Payload)
		case ackChannel:
			a.mu.Lock()
			if _, awaited := a.acks[n.Payload]; awaited {
				a.acks[n.Payload]++
				a.arrived.Broadcast()
			}
			a.mu.Unlock()
		}
	}
}
