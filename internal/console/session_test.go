package console

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// copyOf is a copy of a client's cookies, as a thief would take them.
func copyOf(c *client) []*http.Cookie {
	u, _ := url.Parse(c.base)
	return c.hc.Jar.Cookies(u)
}

// signedInWith reports whether a request to base with the cookies is served
// (200) rather than sent to the sign-in (303).
func signedInWith(t *testing.T, base string, cookies []*http.Cookie) bool {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+"/review", nil)
	for _, ck := range cookies {
		req.AddCookie(ck)
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func logout(t *testing.T, c *client) {
	t.Helper()
	if code, _ := c.do(http.MethodPost, "/logout", url.Values{"csrf": {c.token("/review")}}); code != http.StatusSeeOther {
		t.Fatalf("logout: %d", code)
	}
}

// Guards the end of a session: a copy of the session cookie stops working
// once its owner signs out, on this replica and on another replica that
// shares the secret (the sign-out is a record on the console topic), and
// its open live-update stream ends; signing out everywhere ends every
// session of the person on every replica; a
// password change in the users file (read again on change) ends the
// sessions signed in with the old password; a session ends 12 hours after
// sign-in, and a cookie altered or signed with another secret is none; an
// idle session ends after SessionIdle while one in use goes on.
func TestSessionsEndEverywhere(t *testing.T) {
	opts, set := testCluster(t)
	secret := []byte(strings.Repeat("s", 32))
	dir := t.TempDir()
	usersFile := filepath.Join(dir, "users.yaml")
	writeUsers := func(pw string) {
		h, _ := bcrypt.GenerateFromPassword([]byte(pw), bcrypt.MinCost)
		os.WriteFile(usersFile+".tmp", []byte(fmt.Sprintf("users:\n  - {name: alice, password_bcrypt: %q, roles: [reviewer], owners: [\"*\"]}\n  - {name: victor, password_bcrypt: %q, roles: [viewer]}\n", h, h)), 0o600)
		os.Rename(usersFile+".tmp", usersFile)
	}
	writeUsers("pw")
	users, err := LoadUsers(usersFile)
	if err != nil {
		t.Fatal(err)
	}
	// a short write timeout: the live-update streams check their session at every keep-alive
	cfg := Config{Users: users, UsersFile: usersFile, UsersCheck: 50 * time.Millisecond, Secret: secret, WriteTimeout: 400 * time.Millisecond}
	one, _ := startConsole(t, opts, set, cfg)
	two, _ := startConsole(t, opts, set, cfg)

	alice := newClient(t, one)
	alice.login("alice")
	stolen := copyOf(alice)
	if !signedInWith(t, one, stolen) || !signedInWith(t, two, stolen) {
		t.Fatal("a copy of alice's cookie is not served on both replicas before she signs out")
	}
	stream := openStream(t, two, stolen)
	defer stream.Body.Close()
	logout(t, alice)
	if signedInWith(t, one, stolen) {
		t.Error("a copy of alice's cookie still works on the replica she signed out on")
	}
	if !eventually(func() bool { return !signedInWith(t, two, stolen) }) {
		t.Error("a copy of alice's cookie still works on the other replica after she signed out")
	}
	ended := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, stream.Body); ended <- err }()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Error("the live-update stream of the copied cookie is still open after the sign-out")
	}
	// signing in again works, on both
	alice2 := newClient(t, one)
	alice2.login("alice")
	if !signedInWith(t, two, copyOf(alice2)) {
		t.Error("a new sign-in after the sign-out is refused on the other replica")
	}

	// signing out everywhere ends every session of the person, on both
	// replicas, and a later sign-in works
	laptop, phone := newClient(t, one), newClient(t, two)
	laptop.login("alice")
	phone.login("alice")
	onPhone := copyOf(phone)
	if code, _ := laptop.do(http.MethodPost, "/logout", url.Values{"csrf": {laptop.token("/review")}, "all": {"1"}}); code != http.StatusSeeOther {
		t.Fatalf("sign out everywhere: %d", code)
	}
	if !eventually(func() bool { return !signedInWith(t, one, onPhone) && !signedInWith(t, two, onPhone) }) {
		t.Error("alice's other session still works after she signed out everywhere")
	}
	later := newClient(t, two)
	later.login("alice")
	if !signedInWith(t, one, copyOf(later)) {
		t.Error("a sign-in after signing out everywhere is refused")
	}

	// a password change ends the old sessions
	victor := newClient(t, two)
	victor.login("victor")
	old := copyOf(victor)
	writeUsers("new-pw")
	if !eventually(func() bool { return !signedInWith(t, one, old) && !signedInWith(t, two, old) }) {
		t.Error("victor's session of the old password still works after the users file changed")
	}

	// a session ends 12 hours after sign-in however much it is used, and a
	// cookie altered in any part is no session
	_, srv := startConsole(t, opts, set, Config{Users: testUsers(t), Secret: secret})
	u := srv.users().find("alice")
	now := time.Now()
	fresh := session{Name: "alice", ID: "s1", Issued: now, Seen: now, PwFP: pwFingerprint(u)}
	aged := fresh
	aged.Issued = now.Add(-sessionTTL - time.Minute)
	for _, tc := range []struct {
		name  string
		value string
		ok    bool
	}{
		{"fresh", srv.encodeSession(fresh), true},
		{"13 hours old, used a second ago", srv.encodeSession(aged), false},
		{"signed with another secret", (&Server{secret: []byte(strings.Repeat("x", 32))}).encodeSession(fresh), false},
		{"altered", altered(srv.encodeSession(fresh)), false},
	} {
		r := httptest.NewRequest(http.MethodGet, "/review", nil)
		r.AddCookie(&http.Cookie{Name: sessionCookie, Value: tc.value})
		if got := srv.sessionPerson(nil, r) != nil; got != tc.ok {
			t.Errorf("session %s: accepted %v, want %v", tc.name, got, tc.ok)
		}
	}

	// idle sessions end; used ones go on
	writeUsers("pw")
	idle, _ := startConsole(t, opts, set, Config{Users: testUsers(t), SessionIdle: 400 * time.Millisecond, Secret: secret})
	busy, dozing := newClient(t, idle), newClient(t, idle)
	busy.login("alice")
	dozing.login("victor")
	for i := 0; i < 6; i++ {
		time.Sleep(150 * time.Millisecond)
		if code, _ := busy.do(http.MethodGet, "/review", nil); code != http.StatusOK {
			t.Fatalf("a session in use ended after %d requests: %d", i, code)
		}
	}
	if code, _ := dozing.do(http.MethodGet, "/review", nil); code != http.StatusSeeOther {
		t.Errorf("a session idle for twice SessionIdle: %d, want 303 to the sign-in", code)
	}
}

// eventually polls cond for up to ten seconds.
func eventually(cond func() bool) bool {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return false
}

// openStream opens /events with the cookies.
func openStream(t *testing.T, base string, cookies []*http.Cookie) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+"/events", nil)
	for _, ck := range cookies {
		req.AddCookie(ck)
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/events: %d", resp.StatusCode)
	}
	return resp
}

// altered changes one character in the middle of a cookie value.
func altered(v string) string {
	i := len(v) / 2
	c := byte('A')
	if v[i] == 'A' {
		c = 'B'
	}
	return v[:i] + string(c) + v[i+1:]
}
