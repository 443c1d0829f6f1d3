package console

// throttle.go: failed sign-ins are limited per name and per client address.
// Each key keeps the times of its failures within the window; a key at its
// limit is refused (429, Retry-After: until its oldest failure leaves the
// window) before any password is compared, so a flood costs no bcrypt. A
// success clears the name's failures, not the address's. The counts are
// per replica: behind N replicas a guesser gets up to N times the limit.
// Beyond the limits, at most loginSlots bcrypt compares run at once; a
// sign-in that finds them all busy is refused with 429 as well.

import (
	"strings"
	"sync"
	"time"
)

// maxThrottleKeys bounds the memory of the limiter: past it, keys whose
// failures all left the window are dropped, then the oldest.
const maxThrottleKeys = 100_000

type limiter struct {
	mu     sync.Mutex
	window time.Duration
	fails  map[string][]time.Time
}

func newLimiter(window time.Duration) *limiter {
	return &limiter{window: window, fails: map[string][]time.Time{}}
}

// wait returns how long key must wait before it may try again, 0 when it
// may now: the failures within the window are fewer than limit.
func (l *limiter) wait(key string, limit int, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	fs := l.recent(key, now)
	if len(fs) < limit {
		return 0
	}
	return fs[len(fs)-limit].Add(l.window).Sub(now)
}

// recent drops key's failures that left the window; called with l.mu held.
func (l *limiter) recent(key string, now time.Time) []time.Time {
	fs := l.fails[key]
	i := 0
	for i < len(fs) && now.Sub(fs[i]) >= l.window {
		i++
	}
	fs = fs[i:]
	if len(fs) == 0 {
		delete(l.fails, key)
	} else {
		l.fails[key] = fs
	}
	return fs
}

// fail records a failure of key, keeping at most limit of them.
func (l *limiter) fail(key string, limit int, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.fails[key]; !ok && len(l.fails) >= maxThrottleKeys {
		l.prune(now)
	}
	fs := append(l.recent(key, now), now)
	if len(fs) > limit {
		fs = fs[len(fs)-limit:]
	}
	l.fails[key] = fs
}

// prune drops the keys with no failure in the window, then, if still full,
// the key whose last failure is oldest. Called with l.mu held.
func (l *limiter) prune(now time.Time) {
	oldestKey, oldest := "", now
	for k := range l.fails {
		fs := l.recent(k, now)
		if len(fs) > 0 && fs[len(fs)-1].Before(oldest) {
			oldestKey, oldest = k, fs[len(fs)-1]
		}
	}
	if len(l.fails) >= maxThrottleKeys {
		delete(l.fails, oldestKey)
	}
}

func (l *limiter) clear(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.fails, key)
}

// userKey and addrKey keep names and addresses apart in the limiter.
func userKey(name string) string {
	name = strings.ToLower(strings.TrimSpace(name))
	if len(name) > 256 {
		name = name[:256]
	}
	return "u/" + name
}

func addrKey(addr string) string { return "a/" + addr }
