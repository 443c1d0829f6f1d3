package console

// login.go: the sign-in form. Attempts are limited per account, per client
// address and per known device (throttle.go); every failed and throttled
// sign-in is in the operator log, its address shown to operators only. A
// successful sign-in is an operator action: it is refused when its record
// cannot be written.
//
// A known device is a browser that signed in as the person before: the
// sign-in sets a device cookie (the person's name, a random ID and its
// time, signed with the console's secret; deviceTTL), and a sign-in that
// carries it for the person it names counts against that device only.

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/bcrypt"
)

const (
	deviceCookie = "frc_device"
	// deviceTTL is how long a browser stays a known device after its last
	// sign-in.
	deviceTTL = 90 * 24 * time.Hour
)

func (s *Server) loginPage(w http.ResponseWriter, r *http.Request) {
	if s.identify(w, r) != nil {
		http.Redirect(w, r, safeNext(r.URL.Query().Get("next")), http.StatusSeeOther)
		return
	}
	s.render(w, r, nil, "login", http.StatusOK, "Sign in", "", map[string]any{"Next": r.URL.Query().Get("next"), "Proxy": s.cfg.TrustProxy})
}

func (s *Server) loginPost(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 1<<16)
	r.ParseForm()
	name, addr := r.PostFormValue("name"), s.clientAddr(r)
	data := map[string]any{"Next": r.PostFormValue("next")}
	refuse := func(status int, msg string) {
		data["Error"] = msg
		s.render(w, r, nil, "login", status, "Sign in", "", data)
	}
	if !s.csrfOK(r, nil) {
		s.met.loginFailures.WithLabelValues("csrf").Inc()
		refuse(http.StatusForbidden, "Refused: the form carries no valid CSRF token. Reload the page and try again.")
		return
	}
	u := s.users().find(name)
	device := s.deviceOf(r, u)
	keys := []limitKey{accountKey(u, name, s.cfg.LoginFailuresPerUser), addrKey(addr, s.cfg.LoginFailuresPerAddress)}
	if device != "" {
		keys = []limitKey{deviceKey(u, device, s.cfg.LoginFailuresPerUser)}
	}
	now := time.Now()
	taken, wait := s.limit.take(keys, now)
	if wait > 0 {
		s.throttled(w, u, name, addr, wait)
		refuse(http.StatusTooManyRequests, fmt.Sprintf("Too many failed sign-ins for this name or from this address: try again in %s.", roundUp(wait)))
		return
	}
	ok, busy := s.tryLogin(r.Context(), u, r.PostFormValue("password"), device != "")
	switch {
	case busy:
		s.limit.giveBack(taken, now)
		s.throttled(w, u, name, addr, time.Second)
		refuse(http.StatusTooManyRequests, "Too many sign-ins at once: try again in a second.")
		return
	case !ok:
		s.met.loginFailures.WithLabelValues("password").Inc()
		s.log.Warn("console: sign-in failed: wrong name or password", "user", name, "addr", addr, "known_device", device != "")
		s.note(signInAction("login_failed", u, name, addr, "wrong name or password"))
		refuse(http.StatusUnauthorized, "Wrong name or password.")
		return
	}
	if device != "" {
		s.limit.clear(keys[0])
	} else {
		s.limit.giveBack(taken, now)
		device = newID()
	}
	a := signInAction("login", u, name, addr, "signed in")
	if err := s.record(r.Context(), a); err != nil {
		refuse(http.StatusServiceUnavailable, "The sign-in could not be written to the operator log (Kafka), so it was refused. Try again in a moment.")
		return
	}
	s.setSession(w, r, u)
	s.setDevice(w, r, u, device, now)
	s.log.Info("console: signed in", "user", u.Name, "addr", addr)
	http.Redirect(w, r, safeNext(r.PostFormValue("next")), http.StatusSeeOther)
}

// signInAction is the operator log's record of a sign-in: the person when
// the name is in the users file, else the name typed (shown to operators
// only: it may be a password typed in the wrong field).
func signInAction(action string, u *User, typed string, addr netip.Addr, what string) opAction {
	a := opAction{Action: action, What: what, Addr: addr.String()}
	if u != nil {
		a.User = u.Name
	} else {
		a.Tried = truncate(strings.TrimSpace(typed), 64)
	}
	return a
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// throttled counts, logs and records a sign-in refused for wait and sets
// Retry-After.
func (s *Server) throttled(w http.ResponseWriter, u *User, name string, addr netip.Addr, wait time.Duration) {
	s.met.loginThrottle.Inc()
	s.log.Warn("console: sign-in throttled", "user", name, "addr", addr, "retry_after", roundUp(wait))
	s.note(signInAction("login_throttled", u, name, addr, "refused for "+roundUp(wait).String()))
	w.Header().Set("Retry-After", strconv.Itoa(int(roundUp(wait)/time.Second)))
}

// roundUp rounds d up to a whole second, at least one.
func roundUp(d time.Duration) time.Duration {
	return max(time.Second, (d+time.Second-1)/time.Second*time.Second)
}

// clientAddr is the address of the person: the TCP peer, or, when the peer
// is one of the trusted proxies, the last X-Forwarded-For hop that is not
// one of them. It is used for the sign-in limits and the operator log only;
// whether the identity headers are believed is header mode's business
// (fromTrustedProxy).
func (s *Server) clientAddr(r *http.Request) netip.Addr {
	a, ok := peerAddr(r)
	if !ok || !s.trusted(a) {
		return a
	}
	hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
	for i := len(hops) - 1; i >= 0; i-- {
		h, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
		if err != nil {
			break
		}
		if h = h.Unmap(); !s.trusted(h) {
			return h
		}
	}
	return a
}

// tryLogin compares a password with u's (a dummy hash for an unknown name)
// when a bcrypt slot is free; busy when none is. A known device waits for a
// slot while the request lasts.
func (s *Server) tryLogin(ctx context.Context, u *User, password string, wait bool) (ok, busy bool) {
	if wait {
		select {
		case s.bcrypt <- struct{}{}:
		case <-ctx.Done():
			return false, true
		}
	} else {
		select {
		case s.bcrypt <- struct{}{}:
		default:
			return false, true
		}
	}
	defer func() { <-s.bcrypt }()
	return s.login(u, password), false
}

// login compares a password with u's bcrypt hash; every call is one
// compare, counted.
func (s *Server) login(u *User, password string) bool {
	s.met.loginCompares.Inc()
	if u == nil || u.PasswordBcrypt == "" {
		// spend the same time as a wrong password
		bcrypt.CompareHashAndPassword(s.users().dummy(), []byte(password))
		return false
	}
	return bcrypt.CompareHashAndPassword([]byte(u.PasswordBcrypt), []byte(password)) == nil
}

func newID() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// deviceOf returns the ID of r's device cookie when it is valid and names
// u; "" else.
func (s *Server) deviceOf(r *http.Request, u *User) string {
	if u == nil {
		return ""
	}
	c, err := r.Cookie(s.cookieName(deviceCookie))
	if err != nil {
		return ""
	}
	parts := strings.Split(c.Value, ".")
	if len(parts) != 4 {
		return ""
	}
	name, err := base64.RawURLEncoding.DecodeString(parts[0])
	ms, err2 := strconv.ParseInt(parts[2], 10, 64)
	if err != nil || err2 != nil || string(name) != u.Name || time.Since(time.UnixMilli(ms)) > deviceTTL {
		return ""
	}
	want := hex.EncodeToString(s.mac("device", string(name), parts[1], parts[2]))
	if !hmac.Equal([]byte(parts[3]), []byte(want)) {
		return ""
	}
	return parts[1]
}

// setDevice makes the browser a known device of u for deviceTTL.
func (s *Server) setDevice(w http.ResponseWriter, r *http.Request, u *User, id string, now time.Time) {
	ms := strconv.FormatInt(now.UnixMilli(), 10)
	v := strings.Join([]string{base64.RawURLEncoding.EncodeToString([]byte(u.Name)), id, ms,
		hex.EncodeToString(s.mac("device", u.Name, id, ms))}, ".")
	http.SetCookie(w, &http.Cookie{Name: s.cookieName(deviceCookie), Value: v, Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: s.secure(r), MaxAge: int(deviceTTL / time.Second)})
}
