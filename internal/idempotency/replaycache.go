package idempotency

import (
	"sync"
	"time"
)

// replayCache keeps the finished records this process answered or finished
// recently, so that a retry that comes soon after (the common case: a
// client whose connection dropped, a retry storm) is answered without a
// database round trip.
//
// It is safe because a finished record never changes: its fingerprint and
// its stored response are written once, by the finish, and nothing updates
// them afterwards; only retention deletes the record, a day later. So an
// entry is never stale while its record exists, and several server processes
// need no invalidation between them: each one holds only what it saw
// finished. Unfinished records are never cached (their state moves).
//
// What an entry can outlive is the record itself, for at most TTL: retention
// deleting it (the key is then deduplicated a few seconds longer than
// promised, never shorter), or a database that lost its last commits (a
// restore, a failover to a standby that missed them). In that case the entry
// answers a retry with the answer the lost record held, which is the answer
// Stripe would replay under the same downstream key; the ledger row the
// database lost is restored by reconciliation, or by a retry once the entry
// is gone. So the cache also forgets everything whenever the pool has opened
// a connection since the entries were made (the generation below, the
// pool's count of new connections): a failover, or a database restarted
// after a restore, is reached through new connections, and the entries made
// before it are dropped at once. A pool that merely grows or recycles a
// connection costs the cache its entries, nothing more (docs/lifecycle.md,
// "The replay cache").
//
// Bounded by Size entries; when full, an arbitrary entry makes room (Go's map
// iteration order), which costs nothing to keep and is as good as LRU for
// retries that come in bursts.
type replayCache struct {
	ttl  time.Duration
	size int

	mu sync.Mutex
	m  map[replayCacheKey]replayCacheEntry
	// generation is the pool's count of new connections when the entries in
	// m were made.
	generation int64
}

type replayCacheKey struct {
	scope Scope
	key   string
}

type replayCacheEntry struct {
	fingerprint []byte
	resp        Response
	until       time.Time
}

// newReplayCache returns a cache of at most size entries kept for ttl, or nil
// (no cache) when either is zero.
func newReplayCache(size int, ttl time.Duration) *replayCache {
	if size <= 0 || ttl <= 0 {
		return nil
	}
	return &replayCache{ttl: ttl, size: size, m: make(map[replayCacheKey]replayCacheEntry)}
}

// get returns the finished record of (scope, key) if this process holds it:
// its fingerprint and its stored response (marked Replayed).
func (c *replayCache) get(scope Scope, key string, generation int64, now time.Time) (fingerprint []byte, resp Response, ok bool) {
	if c == nil {
		return nil, Response{}, false
	}
	k := replayCacheKey{scope, key}
	c.mu.Lock()
	var e replayCacheEntry
	if c.renew(generation) {
		e, ok = c.m[k]
	}
	if ok && now.After(e.until) {
		delete(c.m, k)
		ok = false
	}
	c.mu.Unlock()
	if !ok {
		return nil, Response{}, false
	}
	resp = e.resp
	resp.Replayed = true
	return e.fingerprint, resp, true
}

// renew forgets every entry if the pool has opened a connection since they
// were made (generation is newer than the entries'), and tells whether a
// caller at generation may use the cache: not when it is older than the
// entries (its record was read, or finished, before the pool's latest
// connection, so it must neither be stored nor answer from them). c.mu is
// held.
func (c *replayCache) renew(generation int64) bool {
	switch {
	case generation > c.generation:
		clear(c.m)
		c.generation = generation
	case generation < c.generation:
		return false
	}
	return true
}

// put remembers a finished record. resp's Body is kept, not copied: stored
// responses are never modified.
func (c *replayCache) put(scope Scope, key string, fingerprint []byte, resp Response, generation int64, now time.Time) {
	if c == nil {
		return
	}
	k := replayCacheKey{scope, key}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.renew(generation) {
		return
	}
	if _, ok := c.m[k]; !ok && len(c.m) >= c.size {
		for old := range c.m {
			delete(c.m, old)
			break
		}
	}
	c.m[k] = replayCacheEntry{fingerprint: fingerprint, resp: resp, until: now.Add(c.ttl)}
}
