package console

// auth.go: who is asking. Nothing is served without an identity, which comes
// from one of two places:
//
//   - a users file (YAML: name, bcrypt hash, roles, owners) and the login
//     form; the session is a cookie signed with the console's secret, so
//     replicas that share the secret share sessions;
//   - with Config.TrustProxy only, the X-Forwarded-User (or
//     X-Forwarded-Email) header of a reverse proxy in front (oauth2-proxy's
//     convention); its roles come from the users file entry of that name,
//     else Config.ProxyRole.
//
// Every state-changing request carries a CSRF token: its time and an HMAC
// of a random per-browser cookie, the person's name, the session and that
// time, in the form field "csrf" or the X-CSRF-Token header; it is good for
// that session only and for 12 hours at most. Over HTTPS the cookies carry
// the __Host- prefix.

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/bcrypt"
	"gopkg.in/yaml.v3"
)

// Roles.
const (
	RoleViewer   = "viewer"   // reads every page
	RoleReviewer = "reviewer" // decides review items of its owners
	RoleOperator = "operator" // resets breakers, re-drives dead letters
)

// User is one entry of the users file.
type User struct {
	Name string `yaml:"name"`
	// Email matches X-Forwarded-Email behind a trusted proxy.
	Email string `yaml:"email"`
	// PasswordBcrypt is the bcrypt hash of the password; empty for a person
	// who only signs in through the proxy.
	PasswordBcrypt string `yaml:"password_bcrypt"`
	// Roles: viewer, reviewer, operator.
	Roles []string `yaml:"roles"`
	// Owners a reviewer decides for (policy owners such as ai-product); "*"
	// is every owner.
	Owners []string `yaml:"owners"`
}

// Users is the users file.
type Users struct {
	Users []User `yaml:"users"`

	dummyOnce sync.Once
	dummyHash []byte
}

// LoadUsers reads and checks a users file.
func LoadUsers(path string) (*Users, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("console: users file: %w", err)
	}
	return parseUsers(path, b)
}

func parseUsers(path string, b []byte) (*Users, error) {
	var u Users
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	if err := dec.Decode(&u); err != nil {
		return nil, fmt.Errorf("console: users file %s: %w", path, err)
	}
	return &u, u.Validate()
}

// MinBcryptCost is the lowest bcrypt cost a users file may hold: a cheaper
// hash is guessed too fast offline once the file leaks.
const MinBcryptCost = 10

// minBcryptCost is what Validate enforces: MinBcryptCost, lowered by the
// package's tests only, whose many sign-ins would otherwise outlast their
// short server timeouts under the race detector.
var minBcryptCost = MinBcryptCost

// Validate checks every entry: a name, known roles, a bcrypt hash that
// parses and costs at least MinBcryptCost, owners for a reviewer.
func (u *Users) Validate() error {
	seen := map[string]bool{}
	for i, x := range u.Users {
		at := fmt.Sprintf("console: users[%d]", i)
		switch {
		case x.Name == "":
			return fmt.Errorf("%s.name: required", at)
		case seen[x.Name]:
			return fmt.Errorf("%s.name: %q appears twice", at, x.Name)
		case len(x.Roles) == 0:
			return fmt.Errorf("%s.roles: at least one of viewer, reviewer, operator", at)
		}
		seen[x.Name] = true
		for _, r := range x.Roles {
			if r != RoleViewer && r != RoleReviewer && r != RoleOperator {
				return fmt.Errorf("%s.roles: %q: allowed viewer, reviewer, operator", at, r)
			}
		}
		if slices.Contains(x.Roles, RoleReviewer) && len(x.Owners) == 0 {
			return fmt.Errorf("%s.owners: a reviewer needs the owners it decides for (\"*\" for all)", at)
		}
		if x.PasswordBcrypt != "" {
			cost, err := bcrypt.Cost([]byte(x.PasswordBcrypt))
			if err != nil {
				return fmt.Errorf("%s.password_bcrypt: not a bcrypt hash: %v", at, err)
			}
			if cost < minBcryptCost {
				return fmt.Errorf("%s.password_bcrypt: bcrypt cost %d; at least %d is allowed: hash the password again with faultrouter console --hash-password", at, cost, minBcryptCost)
			}
		}
	}
	return nil
}

// findEmail returns the entry whose email is addr.
func (u *Users) findEmail(addr string) *User {
	if u == nil || addr == "" {
		return nil
	}
	for i := range u.Users {
		if strings.EqualFold(u.Users[i].Email, addr) {
			return &u.Users[i]
		}
	}
	return nil
}

func (u *Users) find(name string) *User {
	if u == nil || name == "" {
		return nil
	}
	for i := range u.Users {
		if u.Users[i].Name == name || (u.Users[i].Email != "" && u.Users[i].Email == name) {
			return &u.Users[i]
		}
	}
	return nil
}

// HashPassword returns the bcrypt hash of a password for the users file.
func HashPassword(password string) (string, error) {
	if password == "" {
		return "", errors.New("console: an empty password")
	}
	h, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.DefaultCost)
	return string(h), err
}

// person is who is asking, and what they may do.
type person struct {
	Name   string
	Roles  []string
	Owners []string
	Proxy  bool // identified by the trusted proxy's header
	// Session is the ID of the session the person signed in with.
	Session string
}

func (p *person) has(role string) bool { return p != nil && slices.Contains(p.Roles, role) }

// canDecide reports whether p may decide items of owner.
func (p *person) canDecide(owner string) bool {
	return p.has(RoleReviewer) && (slices.Contains(p.Owners, "*") || slices.Contains(p.Owners, owner))
}

func (p *person) reviewer() bool { return p.has(RoleReviewer) }
func (p *person) operator() bool { return p.has(RoleOperator) }

const (
	sessionCookie = "frc_session"
	nonceCookie   = "frc_nonce"
	sessionTTL    = 12 * time.Hour
)

var errNoSession = errors.New("console: no valid session")

func (s *Server) mac(parts ...string) []byte {
	m := hmac.New(sha256.New, s.secret)
	m.Write([]byte(strings.Join(parts, "\x00")))
	return m.Sum(nil)
}

// identify returns the person asking, nil when nobody is signed in; a
// session's renewed cookie goes on w.
func (s *Server) identify(w http.ResponseWriter, r *http.Request) *person {
	if s.fromTrustedProxy(r) {
		// the e-mail first: the identity provider verified it, while the
		// user header may be an opaque subject or a name people choose
		name, u := r.Header.Get("X-Forwarded-Email"), (*User)(nil)
		if name != "" {
			u = s.users().findEmail(name)
		} else if name = r.Header.Get("X-Forwarded-User"); name != "" {
			u = s.users().find(name)
		}
		if name != "" {
			if u != nil {
				return &person{Name: u.Name, Roles: u.Roles, Owners: u.Owners, Proxy: true}
			}
			p := &person{Name: name, Roles: []string{s.cfg.ProxyRole}, Proxy: true}
			if s.cfg.ProxyRole == RoleReviewer {
				p.Owners = []string{"*"}
			}
			return p
		}
	}
	return s.sessionPerson(w, r)
}

// nonce returns the browser's CSRF nonce, setting the cookie when absent.
func (s *Server) nonce(w http.ResponseWriter, r *http.Request) string {
	name := s.cookieName(nonceCookie)
	if c, err := r.Cookie(name); err == nil && len(c.Value) >= 16 {
		return c.Value
	}
	n := newID()
	http.SetCookie(w, &http.Cookie{Name: name, Value: n, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: s.secure(r)})
	r.AddCookie(&http.Cookie{Name: name, Value: n})
	return n
}

// csrfTTL is how long a page's CSRF token is accepted.
const csrfTTL = sessionTTL

// csrfToken is the token the pages of p (nil: nobody signed in) put in
// their forms: its time and an HMAC of the browser's nonce, the person, the
// session and that time, so that it is good for that session only and for
// csrfTTL at most.
func (s *Server) csrfToken(w http.ResponseWriter, r *http.Request, p *person) string {
	return s.csrfAt(s.nonce(w, r), p, time.Now())
}

func (s *Server) csrfAt(nonce string, p *person, at time.Time) string {
	name, session := "", ""
	if p != nil {
		name, session = p.Name, p.Session
	}
	ts := strconv.FormatInt(at.Unix(), 16)
	return fmt.Sprintf("%012s", ts) + hex.EncodeToString(s.mac("csrf", nonce, name, session, ts))
}

// csrfOK checks the token of a state-changing request.
func (s *Server) csrfOK(r *http.Request, p *person) bool {
	c, err := r.Cookie(s.cookieName(nonceCookie))
	if err != nil {
		return false
	}
	got := r.Header.Get("X-CSRF-Token")
	if got == "" {
		got = r.PostFormValue("csrf")
	}
	if len(got) < 12 {
		return false
	}
	secs, err := strconv.ParseInt(got[:12], 16, 64)
	if err != nil {
		return false
	}
	at := time.Unix(secs, 0)
	if age := time.Since(at); age > csrfTTL || age < -time.Minute {
		return false
	}
	return hmac.Equal([]byte(got), []byte(s.csrfAt(c.Value, p, at)))
}

// dummy is a hash of a random password at the highest cost of the users
// file (bcrypt's default when it holds none): a sign-in with an unknown name
// compares against it, so that it costs what a known name's does.
func (u *Users) dummy() []byte {
	if u == nil {
		u = &noUsers
	}
	u.dummyOnce.Do(func() {
		cost := bcrypt.DefaultCost
		if len(u.Users) > 0 {
			cost = bcrypt.MinCost
		}
		for _, x := range u.Users {
			if c, err := bcrypt.Cost([]byte(x.PasswordBcrypt)); err == nil && c > cost {
				cost = c
			}
		}
		pw := make([]byte, 16)
		rand.Read(pw)
		u.dummyHash, _ = bcrypt.GenerateFromPassword([]byte(hex.EncodeToString(pw)), cost)
	})
	return u.dummyHash
}

var noUsers Users

func (s *Server) clearSession(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: s.cookieName(sessionCookie), Value: "", Path: "/", MaxAge: -1, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: s.secure(r)})
}

// secure reports whether cookies are marked Secure: whenever people reach
// the console over HTTPS.
func (s *Server) secure(r *http.Request) bool { return r.TLS != nil || s.cfg.https() }

// cookieName is the name of one of the console's cookies: with the
// __Host- prefix when the console is reached over HTTPS (the browser then
// takes the cookie only from this host, Secure and for the whole site, so a
// neighbouring subdomain cannot plant or shadow it). Over plain HTTP a
// browser refuses a __Host- cookie, so the name stays bare.
func (s *Server) cookieName(base string) string {
	if s.cfg.https() {
		return "__Host-" + base
	}
	return base
}
