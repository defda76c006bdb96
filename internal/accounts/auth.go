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

// listenStatement is the one statement with which a listening connection
// subscribes.
const listenStatement = "LISTEN " + authChannel

// A listening connection, once subscribed, holds this session advisory lock
// in shared mode (the two-int4 form, so that it never meets a one-bigint
// lock such as the relay's or the migrations'). pg_locks then lists each
// subscribed listener with its backend pid, to any role, through any pooler
// in front of the server, and PostgreSQL drops the row the moment the
// connection ends: that is how the revoking process knows whose
// acknowledgements to wait for. (pg_stat_activity, the older way, shows
// another role's query text only to privileged roles, and behind a pooler
// the statement text tells nothing about who listens.)
const (
	listenerLockClass = 0x69646d70 // "idmp"
	listenerLockObj   = 1          // the auth cache's listeners
)

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

	// Direct opens the listening connection; nil takes it out of the pool
	// given to Listen. Set it before Listen when that pool goes through a
	// transaction pooler.
	Direct Direct

	// beforeForget, when set (by tests), runs before each message is
	// applied: a slow process, to show that the sender waits for it.
	beforeForget func()

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

// Direct opens a connection to PostgreSQL itself for a session of its own:
// a LISTEN, and the advisory lock that marks a listener, live as long as
// their connection, which a transaction pooler (PgBouncer in transaction
// mode) would hand to other clients between transactions. Where the pool
// goes through such a pooler, Direct must reach the server past it (see
// DialURL); nil takes the connection out of the pool instead, which is
// right when the pool itself is direct.
type Direct func(ctx context.Context) (*pgx.Conn, error)

// DialURL is a Direct that connects to url, a PostgreSQL URL that bypasses
// any pooler; a multi-host URL with target_session_attrs=read-write follows
// the primary across a failover like the pool's.
func DialURL(url string) (Direct, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parsing the direct database URL: %w", err)
	}
	return func(ctx context.Context) (*pgx.Conn, error) { return pgx.ConnectConfig(ctx, cfg) }, nil
}

// open returns a connection of its own: from d, or taken out of pool for
// good (a listening connection goes back to no other user).
func (d Direct) open(ctx context.Context, pool *pgxpool.Pool) (*pgx.Conn, error) {
	if d != nil {
		return d(ctx)
	}
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return pc.Hijack(), nil
}

// ackPayload is a listener's acknowledgement of msg: its backend pid, a
// space, and msg, so that the sender counts each listener once and only
// the listeners it waits for.
func ackPayload(pid uint32, msg string) string { return fmt.Sprintf("%d %s", pid, msg) }

// invalidation is a change of keys or accounts about to commit, whose
// sender waits for every listening process to have applied it.
type invalidation struct {
	conn *pgx.Conn // LISTENs on the acknowledgement channel
	msg  string
}

// expectInvalidation prepares a change about to commit: it subscribes to
// the acknowledgements (on a connection from direct, or taken out of pool)
// before the commit, so that none is missed. Call wait after the commit,
// and close in any case.
func expectInvalidation(ctx context.Context, pool *pgxpool.Pool, direct Direct, msg string) (*invalidation, error) {
	conn, err := direct.open(ctx, pool)
	if err != nil {
		return nil, err
	}
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

// listenersQuery lists the backend pids of the subscribed listeners of
// this database: those holding the listener lock.
const listenersQuery = `SELECT pid FROM pg_locks
	WHERE locktype = 'advisory' AND granted AND objsubid = 2
	  AND classid = $1::int8::oid AND objid = $2::int8::oid
	  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`

// wait returns once every listener subscribed when the change committed
// (and still connected now) has acknowledged the message, or after
// ackTimeout: so a revocation or a mode change answers only once it applies
// everywhere (I11). It reads the listeners after the commit: one that
// subscribed before the commit is listed and receives the message; one
// that subscribes in between is listed too but never hears of it (it
// started with an empty cache, so it holds nothing to forget), and only
// makes this wait run to ackTimeout.
func (iv *invalidation) wait(ctx context.Context, pool *pgxpool.Pool) {
	rows, err := pool.Query(ctx, listenersQuery, listenerLockClass, listenerLockObj)
	if err != nil {
		return
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return
	}
	pending := make(map[string]bool, len(pids))
	for _, pid := range pids {
		pending[ackPayload(uint32(pid), iv.msg)] = true
	}
	ctx, cancel := context.WithTimeout(ctx, ackTimeout)
	defer cancel()
	for len(pending) > 0 {
		n, err := iv.conn.WaitForNotification(ctx)
		if err != nil {
			return
		}
		delete(pending, n.Payload)
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
// so no process trusts a key it may have missed the revocation of. The
// connection comes from a.Direct, or out of pool; pool carries only the
// acknowledgements, which need no session, so it may go through a
// transaction pooler.
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
	conn, err := a.Direct.open(ctx, pool)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.PgConn().Exec(ctx, listenStatement).ReadAll(); err != nil {
		return err
	}
	// Only now, subscribed, does this listener show itself to the
	// revoking processes; the pid its acknowledgements carry is the one
	// pg_locks shows (the server's, even through a session pooler).
	var pid int32
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid() FROM (SELECT pg_advisory_lock_shared($1, $2)) l",
		int32(listenerLockClass), int32(listenerLockObj)).Scan(&pid); err != nil {
		return fmt.Errorf("marking the listener: %w", err)
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
		if a.beforeForget != nil {
			a.beforeForget()
		}
		a.forget(n.Payload)
		// Acknowledge on another connection: this one only listens. A
		// NOTIFY needs no session, so the pool may go through a pooler.
		go func(ack string) {
			if _, err := pool.Exec(context.WithoutCancel(ctx), "SELECT pg_notify($1, $2)", ackChannel, ack); err != nil {
				log.WarnContext(ctx, "auth cache: acknowledging an invalidation", "err", err)
			}
		}(ackPayload(uint32(pid), n.Payload))
	}
}
