package console

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/crypto/bcrypt"
)

// signIn posts the sign-in form from c as seen through a proxy that says
// the person's address is xff ("" for none) and returns the status and the
// page.
func signIn(c *client, tok, name, pw, xff string) (int, string) {
	c.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, c.base+"/login", strings.NewReader(url.Values{"csrf": {tok}, "name": {name}, "password": {pw}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if xff != "" {
		req.Header.Set("X-Forwarded-For", xff)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// crowdUsers are alice (with an e-mail address), victor and olga, an
// operator.
func crowdUsers(t *testing.T) *Users {
	u := &Users{Users: []User{
		{Name: "alice", Email: "alice@example.com", PasswordBcrypt: string(pwHash()), Roles: []string{RoleReviewer}, Owners: []string{"ai_product"}},
		{Name: "victor", PasswordBcrypt: string(pwHash()), Roles: []string{RoleViewer}},
		{Name: "olga", PasswordBcrypt: string(pwHash()), Roles: []string{RoleOperator}},
	}}
	if err := u.Validate(); err != nil {
		t.Fatal(err)
	}
	return u
}

// Guards sign-in against a crowd: behind the ingress (a trusted proxy,
// whose X-Forwarded-For names the person's address), 1,000 failed sign-ins
// from other addresses, from alice's own address and from the ingress
// itself, naming alice, her e-mail, victor and names nobody has, do not
// keep alice out: her correct password from the browser she signed in with
// before (its device cookie) signs her in. A browser she never signed in
// with is still held to the account's limit, so the crowd gets no more
// guesses than before.
func TestACrowdCannotLockAPersonOut(t *testing.T) {
	reg := prometheus.NewRegistry()
	base, _, _ := testConsole(t, Config{Users: crowdUsers(t), Registerer: reg,
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}})
	const home = "203.0.113.7"
	alice := newClient(t, base)
	if code, body := signIn(alice, alice.token("/login"), "alice", "pw", home); code != http.StatusSeeOther {
		t.Fatalf("alice's first sign-in: %d %s", code, pageError(body))
	}
	logout(t, alice)

	crowd := newClient(t, base)
	tok := crowd.token("/login")
	names := []string{"alice", "alice@example.com", "victor", "root", "admin"}
	refused := 0
	for i := 0; i < 1000; i++ {
		var xff string
		switch i % 4 {
		case 0:
			xff = fmt.Sprintf("198.51.%d.%d", i/250, i%250)
		case 1:
			xff = fmt.Sprintf("2001:db8:%x::1", i)
		case 2:
			xff = home // alice's own address
		} // case 3: the ingress's own address
		code, _ := signIn(crowd, tok, names[i%len(names)], fmt.Sprintf("guess-%d", i), xff)
		if code == http.StatusSeeOther {
			t.Fatalf("attempt %d signed in with a guess", i)
		}
		if code == http.StatusTooManyRequests {
			refused++
		}
	}
	if refused < 900 {
		t.Errorf("%d of 1,000 guesses throttled, want most", refused)
	}
	if code, body := signIn(alice, alice.token("/login"), "alice", "pw", home); code != http.StatusSeeOther {
		t.Fatalf("alice from her own browser after the crowd: %d %q; want 303 (signed in)", code, pageError(body))
	}
	if code, _ := alice.do(http.MethodGet, "/review", nil); code != http.StatusOK {
		t.Errorf("alice's queue after signing in: %d", code)
	}
	stranger := newClient(t, base)
	if code, _ := signIn(stranger, stranger.token("/login"), "alice", "pw", "192.0.2.50"); code != http.StatusTooManyRequests {
		t.Errorf("alice's name and password from a browser she never used, while the crowd's failures stand: %d, want 429", code)
	}
}

// Guards the per-account limit under a burst: 40 concurrent sign-ins for
// one account, by its name and by its e-mail, each from its own address,
// compare at most the limit of passwords (5): an attempt is counted before
// its compare. The compares are counted by the console
// (faultrouter_console_login_compares_total), not timed.
func TestABurstComparesAtMostTheLimit(t *testing.T) {
	reg := prometheus.NewRegistry()
	base, _, _ := testConsole(t, Config{Users: crowdUsers(t), Registerer: reg,
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}})
	c := newClient(t, base)
	tok := c.token("/login")
	var wg sync.WaitGroup
	start := make(chan struct{})
	codes := make([]int, 40)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			name := []string{"alice", "alice@example.com"}[i%2]
			for {
				code, body := signIn(c, tok, name, "guess", fmt.Sprintf("198.51.100.%d", i+1))
				// all bcrypt slots busy: the person tries again
				if code == http.StatusTooManyRequests && strings.Contains(body, "at once") {
					time.Sleep(time.Millisecond)
					continue
				}
				codes[i] = code
				return
			}
		}()
	}
	close(start)
	wg.Wait()
	failed, throttled := 0, 0
	for _, code := range codes {
		switch code {
		case http.StatusUnauthorized:
			failed++
		case http.StatusTooManyRequests:
			throttled++
		}
	}
	if got := counterOf(t, reg, "faultrouter_console_login_compares_total"); got > 5 || got < 1 {
		t.Errorf("%v passwords compared for alice in a burst of 40, want 1 to 5 (401: %d, 429: %d)", got, failed, throttled)
	}
	if failed > 5 {
		t.Errorf("%d of 40 concurrent guesses were compared and refused as wrong (401), want at most 5", failed)
	}
	if failed+throttled != 40 || failed == 0 {
		t.Errorf("answers: %d wrong password, %d throttled of 40", failed, throttled)
	}
}

// Guards the per-address limit for IPv6: the addresses of one /64 (one
// subscriber's block) share one count, so walking the block gets no more
// guesses than one address.
func TestIPv6AddressesCountByTheirSlash64(t *testing.T) {
	base, _, _ := testConsole(t, Config{Users: crowdUsers(t), LoginFailuresPerAddress: 4,
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}})
	c := newClient(t, base)
	tok := c.token("/login")
	for i := 1; i <= 4; i++ {
		if code, _ := signIn(c, tok, fmt.Sprintf("nobody-%d", i), "guess", fmt.Sprintf("2001:db8:1:2::%x", i)); code != http.StatusUnauthorized {
			t.Fatalf("guess %d: %d, want 401", i, code)
		}
	}
	if code, _ := signIn(c, tok, "victor", "pw", "2001:db8:1:2:ffff::1"); code != http.StatusTooManyRequests {
		t.Errorf("another address of the same /64 after 4 failures: %d, want 429", code)
	}
	if code, _ := signIn(c, tok, "victor", "pw", "2001:db8:1:3::1"); code != http.StatusSeeOther {
		t.Errorf("an address of another /64: %d, want 303", code)
	}
}

// Guards the limiter's memory bound against a flood: a key at its limit
// stays at its limit while a flood of new keys fills the limiter (new keys
// then share one overflow count), so a flood never resets a victim's
// count; the people of the users file are outside the bound.
func TestAFloodDoesNotResetAVictimsCount(t *testing.T) {
	l := newLimiter(time.Minute)
	l.maxKeys = 100
	now := time.Now()
	victim := addrKey(netip.MustParseAddr("192.0.2.1"), 3)
	account := accountKey(&User{Name: "alice"}, "alice", 3)
	for i := 0; i < 3; i++ {
		if _, wait := l.take([]limitKey{victim, account}, now); wait != 0 {
			t.Fatalf("attempt %d refused", i)
		}
	}
	for i := 0; i < 100_000; i++ {
		l.take([]limitKey{addrKey(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 3)}, now.Add(time.Duration(i)))
	}
	later := now.Add(30 * time.Second)
	if _, wait := l.take([]limitKey{victim}, later); wait == 0 {
		t.Errorf("the victim's address was let through after a flood of 100,000 addresses")
	}
	if _, wait := l.take([]limitKey{account}, later); wait == 0 {
		t.Errorf("alice's account was let through after a flood of 100,000 addresses")
	}
	if len(l.tries) > l.maxKeys+3 {
		t.Errorf("the limiter holds %d keys, bound %d", len(l.tries), l.maxKeys)
	}
	// once the window has passed, the flood's keys go and new keys count alone
	if _, wait := l.take([]limitKey{addrKey(netip.MustParseAddr("192.0.2.99"), 3)}, now.Add(2*time.Minute)); wait != 0 {
		t.Errorf("a new address after the window: waits %s", wait)
	}
}

// Guards the operator log of sign-ins: a failed and a throttled sign-in
// are records in it (as is a successful one); an operator sees the client
// address and the name typed when it is not in the users file (it may be a
// password typed in the wrong field), a viewer sees neither.
func TestSignInFailuresInTheOperatorLog(t *testing.T) {
	base, _, _ := testConsole(t, Config{Users: crowdUsers(t), LoginFailuresPerUser: 2,
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	c := newClient(t, base)
	tok := c.token("/login")
	signIn(c, tok, "alice", "guess", "198.51.100.7")
	signIn(c, tok, "alice", "guess", "198.51.100.7")
	if code, _ := signIn(c, tok, "alice", "guess", "198.51.100.7"); code != http.StatusTooManyRequests {
		t.Fatalf("third guess: %d, want 429", code)
	}
	signIn(c, tok, "Tr0ub4dor&3", "guess", "198.51.100.8")

	olga := newClient(t, base)
	olga.login("olga")
	body := waitFor(t, olga, "/operators", func(b string) bool {
		return strings.Count(b, "login_failed") >= 3 && strings.Contains(b, "login_throttled")
	})
	for _, want := range []string{"198.51.100.7", "198.51.100.8", "Tr0ub4dor&amp;3", "unknown name"} {
		if !strings.Contains(body, want) {
			t.Errorf("the operator's log lacks %q", want)
		}
	}
	victor := newClient(t, base)
	victor.login("victor")
	body = waitFor(t, victor, "/operators", func(b string) bool { return strings.Contains(b, "login_throttled") })
	for _, hidden := range []string{"198.51.100.", "127.0.0.1", "Tr0ub4dor"} {
		if strings.Contains(body, hidden) {
			t.Errorf("a viewer's operator log shows %q", hidden)
		}
	}
}

// Guards the users file's hashes: a bcrypt cost below 10 is refused with
// one error naming the entry's field, the cost found and the least allowed.
func TestUsersFileRefusesCheapHashes(t *testing.T) {
	minBcryptCost = MinBcryptCost
	defer func() { minBcryptCost = bcrypt.MinCost }()
	cheap, err := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	_, err = parseUsers("users.yaml", []byte(fmt.Sprintf("users:\n  - {name: alice, password_bcrypt: %q, roles: [viewer]}\n", cheap)))
	if err == nil || !strings.Contains(err.Error(), "users[0].password_bcrypt") || !strings.Contains(err.Error(), "cost 4") || !strings.Contains(err.Error(), "at least 10") {
		t.Errorf("a cost-4 hash: %v; want one error naming users[0].password_bcrypt, cost 4 and at least 10", err)
	}
	good, err := bcrypt.GenerateFromPassword([]byte("pw"), MinBcryptCost)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := parseUsers("users.yaml", []byte(fmt.Sprintf("users:\n  - {name: alice, password_bcrypt: %q, roles: [viewer]}\n", good))); err != nil {
		t.Errorf("a cost-10 hash: %v", err)
	}
}

// Guards header identity behind the proxy: X-Forwarded-Email, which the
// identity provider verified, names the person when both headers come; the
// user header (an opaque subject, or a name people choose) does not
// override it.
func TestForwardedEmailWinsOverForwardedUser(t *testing.T) {
	base, _, _ := testConsole(t, Config{TrustProxy: true, Users: crowdUsers(t), TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}})
	req, _ := http.NewRequest(http.MethodGet, base+"/operators", nil)
	req.Header.Set("X-Forwarded-User", "olga")
	req.Header.Set("X-Forwarded-Email", "alice@example.com")
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `<b id="me">alice</b>`) {
		t.Errorf("both headers: status %d, the page is not alice's (the user header won)", resp.StatusCode)
	}
}

// Guards the CSRF token's scope: a token is good for the session it was
// given in only (a token from before a sign-out and sign-in in the same
// browser is refused) and for csrfTTL at most.
func TestCSRFTokenIsTiedToTheSessionAndExpires(t *testing.T) {
	base, _, _ := testConsole(t, Config{Users: crowdUsers(t)})
	alice := newClient(t, base)
	alice.login("alice")
	old := alice.token("/review")
	logout(t, alice)
	alice.login("alice")
	form := url.Values{"csrf": {old}, "task": {"t-1"}, "op": {"claim"}}
	if code, _ := alice.do(http.MethodPost, "/review/claim", form); code != http.StatusForbidden {
		t.Errorf("a token of alice's previous session: %d, want 403", code)
	}

	s := &Server{secret: make([]byte, 32)}
	p := &person{Name: "alice", Session: "s1"}
	check := func(tok string) bool {
		r := httptest.NewRequest(http.MethodPost, "/review/claim", strings.NewReader(url.Values{"csrf": {tok}}.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.AddCookie(&http.Cookie{Name: nonceCookie, Value: "0123456789abcdef"})
		return s.csrfOK(r, p)
	}
	if !check(s.csrfAt("0123456789abcdef", p, time.Now().Add(-time.Hour))) {
		t.Errorf("an hour-old token of the session is refused")
	}
	if check(s.csrfAt("0123456789abcdef", p, time.Now().Add(-csrfTTL-time.Minute))) {
		t.Errorf("a token older than %s is accepted", csrfTTL)
	}
	if check(s.csrfAt("0123456789abcdef", &person{Name: "alice", Session: "s2"}, time.Now())) {
		t.Errorf("a token of another session is accepted")
	}
}
