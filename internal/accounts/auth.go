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

	"github.com/jackc/pgx/v5"
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
const listenStatement = "LISTEN " + authChannel

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
}

type cachedAccount struct {
	acct  Account
	until time.Time
}

// NewAuthenticator returns an Authenticator over db; ttl 0 turns the cache off.
func NewAuthenticator(db dbsqlc.DBTX, ttl time.Duration) *Authenticator {
	return &Authenticator{db: db, ttl: ttl, cache: map[[sha256.Size]byte]cachedAccount{}}
}

// Subscribed tells whether the listener is subscribed to the invalidation
// channel, so that the cache is in use (tests wait for it).
func (a *Authenticator) Subscribed() bool { return a.subscribed.Load() }

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

// invalidation is a change of keys or accounts about to commit, whose
// sender waits for every listening process to have applied it.
type invalidation struct {
	conn *pgx.Conn // LISTENs on the acknowledgement channel
	msg  string
}

// expectInvalidation prepares a change about to commit: it subscribes to
// the acknowledgements before the commit, so that none is missed. Call wait
// after the commit, and close in any case.
func expectInvalidation(ctx context.Context, pool *pgxpool.Pool, msg string) (*invalidation, error) {
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	conn := pc.Hijack() // a listening connection goes back to no other user
	if _, err := conn.Exec(ctx, "LISTEN "+ackChannel); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return &invalidation{conn: conn, msg: msg}, nil
}

// ackTimeout bounds wait: long enough for every process of a loaded
// machine to acknowledge, short enough that a wedged one cannot hold a
// revocation or a mode change up for long.
const ackTimeout = 5 * time.Second

// wait returns once every listening process (those whose listening
// connection pg_stat_activity shows) has acknowledged the message, or after
// ackTimeout: so a revocation or a mode change answers only once it applies
// everywhere (I11).
func (iv *invalidation) wait(ctx context.Context, pool *pgxpool.Pool) {
	var listeners int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND query = $1`, listenStatement).Scan(&listeners); err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, ackTimeout)
	defer cancel()
	for acks := 0; acks < listeners; {
		n, err := iv.conn.WaitForNotification(ctx)
		if err != nil {
			return
		}
		if n.Payload == iv.msg {
			acks++
		}
	}
}

func (iv *invalidation) close() {
	if iv != nil {
		iv.conn.Close(context.Background())
	}
}

// Listen subscribes to the invalidation channel on a connection of its own
// and applies every message until ctx is done. While it is not subscribed
// (before the first LISTEN, after a lost connection) the cache is not used,
// so no process trusts a key it may have missed the revocation of.
func (a *Authenticator) Listen(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) {
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
	defer conn.Close(context.WithoutCancel(ctx))
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
		if n.Channel != authChannel {
			continue // another process's acknowledgement
		}
		a.forget(n.Payload)
		// Acknowledge on another connection: this one only listens.
		go func(msg string) {
			if _, err := pool.Exec(context.WithoutCancel(ctx), "SELECT pg_notify($1, $2)", ackChannel, msg); err != nil {
				log.WarnContext(ctx, "auth cache: acknowledging an invalidation", "err", err)
			}
		}(n.Payload)
	}
}
