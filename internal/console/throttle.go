package console

// throttle.go: sign-in attempts are limited so that guessing is slow and a
// crowd cannot lock people out.
//
//   - Per account: the attempts on one person of the users file (by name or
//     by e-mail: the key is the person the name resolves to; a name not in
//     the file is its own key) within the window.
//   - Per client address: the person's address, taken from X-Forwarded-For
//     only when the TCP peer is one of --trusted-proxies (independent of
//     header identity); IPv6 addresses count by their /64.
//   - A known device (a browser holding the signed device cookie of an
//     earlier sign-in of that person) is limited on its own key only: the
//     account's and the address's counts, which anyone can fill, do not
//     apply to it, so a correct password from a known device signs in
//     however many failures others caused.
//
// An attempt is counted when it is let through, before its password is
// compared, so a burst of concurrent attempts compares at most the limit; a
// successful sign-in gives its own attempt back. A key at its limit is
// refused (429, Retry-After: until its oldest attempt leaves the window)
// without a compare. The counts are per replica: behind N replicas a
// guesser gets up to N times the limit.
//
// Memory: at most maxThrottleKeys addresses and unknown names. A key in the
// limiter keeps its count until its attempts leave the window, whatever
// comes after: when the limiter is full, new keys share one overflow key of
// their kind (and are refused together once it fills), so a flood of new
// keys never resets a counted one. People of the users file and their
// devices are outside that bound.
//
// Beyond the limits, at most loginSlots bcrypt compares run at once; a
// sign-in that finds them all busy is refused with 429 as well (a known
// device waits for a slot instead).

import (
	"net/netip"
	"strings"
	"sync"
	"time"
)

// maxThrottleKeys bounds the addresses and unknown names the limiter keeps.
const maxThrottleKeys = 100_000

type limiter struct {
	mu     sync.Mutex
	window time.Duration
	// tries are the attempts of each key within the window, oldest first.
	tries map[string][]time.Time
	// bounded counts the keys of tries that are subject to maxThrottleKeys.
	bounded   int
	maxKeys   int
	lastPrune time.Time
}

func newLimiter(window time.Duration) *limiter {
	return &limiter{window: window, tries: map[string][]time.Time{}, maxKeys: maxThrottleKeys}
}

// limitKey is one count of the limiter and its limit.
type limitKey struct {
	key   string
	limit int
	// bounded keys (addresses, unknown names) are subject to maxThrottleKeys
	// and share overflow when the limiter is full.
	bounded  bool
	overflow string
}

// take counts an attempt against every key when each is below its limit,
// and returns the keys as counted (a key may have become its overflow key)
// and 0; else it counts nothing and returns how long until the fullest key
// lets an attempt through.
func (l *limiter) take(keys []limitKey, now time.Time) ([]limitKey, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var wait time.Duration
	out := make([]limitKey, len(keys))
	for i, k := range keys {
		if _, ok := l.tries[k.key]; !ok && k.bounded && l.full(now) {
			k.key = k.overflow
		}
		out[i] = k
		fs := l.recent(k.key, now)
		if len(fs) >= k.limit {
			wait = max(wait, fs[len(fs)-k.limit].Add(l.window).Sub(now))
		}
	}
	if wait > 0 {
		return nil, wait
	}
	for _, k := range out {
		if _, ok := l.tries[k.key]; !ok && k.bounded {
			l.bounded++
		}
		l.tries[k.key] = append(l.tries[k.key], now)
	}
	return out, 0
}

// giveBack removes one attempt taken at at from each key: a successful
// sign-in, or one refused before its compare.
func (l *limiter) giveBack(keys []limitKey, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range keys {
		fs := l.tries[k.key]
		for i := len(fs) - 1; i >= 0; i-- {
			if fs[i].Equal(at) {
				fs = append(fs[:i:i], fs[i+1:]...)
				break
			}
		}
		l.set(k, fs)
	}
}

// clear forgets a key's attempts.
func (l *limiter) clear(k limitKey) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.set(k, nil)
}

// set stores a key's attempts; called with l.mu held.
func (l *limiter) set(k limitKey, fs []time.Time) {
	_, had := l.tries[k.key]
	if len(fs) > 0 {
		l.tries[k.key] = fs
		return
	}
	delete(l.tries, k.key)
	if had && k.bounded {
		l.bounded--
	}
}

// recent drops key's attempts that left the window; called with l.mu held.
// A key emptied here stays counted as bounded until a prune drops it.
func (l *limiter) recent(key string, now time.Time) []time.Time {
	fs := l.tries[key]
	i := 0
	for i < len(fs) && now.Sub(fs[i]) >= l.window {
		i++
	}
	if i > 0 {
		fs = fs[i:]
		l.tries[key] = fs
	}
	return fs
}

// full reports whether no new bounded key fits; when full, it drops the
// keys whose attempts all left the window, at most once a second (a flood
// of new keys does not make every attempt walk the limiter). Called with
// l.mu held.
func (l *limiter) full(now time.Time) bool {
	if l.bounded < l.maxKeys {
		return false
	}
	if now.Sub(l.lastPrune) >= time.Second {
		l.lastPrune = now
		for k := range l.tries {
			if len(l.recent(k, now)) == 0 {
				delete(l.tries, k)
				if boundedKey(k) {
					l.bounded--
				}
			}
		}
	}
	return l.bounded >= l.maxKeys
}

// Key kinds: a person of the users file, a device of a person, an unknown
// name, a client address; the unknown names and the addresses are bounded.
const (
	kindAccount = "u/"
	kindDevice  = "d/"
	kindName    = "n/"
	kindAddr    = "a/"
)

func boundedKey(k string) bool {
	return strings.HasPrefix(k, kindName) || strings.HasPrefix(k, kindAddr)
}

// accountKey is the count of the person a sign-in names: the user's own
// name when the name (or e-mail) is in the users file, else the name typed.
func accountKey(u *User, typed string, limit int) limitKey {
	if u != nil {
		return limitKey{key: kindAccount + u.Name, limit: limit}
	}
	typed = strings.ToLower(strings.TrimSpace(typed))
	if len(typed) > 256 {
		typed = typed[:256]
	}
	return limitKey{key: kindName + typed, limit: limit, bounded: true, overflow: kindName + "*"}
}

// deviceKey is the count of one known device of a person.
func deviceKey(u *User, device string, limit int) limitKey {
	return limitKey{key: kindDevice + u.Name + "/" + device, limit: limit}
}

// addrKey is the count of a client address; an IPv6 address counts by its
// /64, the block one subscriber usually holds.
func addrKey(a netip.Addr, limit int) limitKey {
	key := a.String()
	if a.Is6() && !a.Is4In6() {
		p, _ := a.Prefix(64)
		key = p.String()
	}
	return limitKey{key: kindAddr + key, limit: limit, bounded: true, overflow: kindAddr + "*"}
}
