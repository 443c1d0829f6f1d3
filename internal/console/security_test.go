package console

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/crypto/bcrypt"

	"github.com/faultrouter/faultrouter/internal/lockedbuf"
)

// Guards the redirect after sign-in: it stays on this site whatever "next"
// says. Browsers drop tabs, newlines and other control characters from a
// URL and read a backslash as a slash, so "/\t/evil.com" is "//evil.com" to
// them: a link to the sign-in with such a next would send a person who signs
// in to another site.
func TestSignInRedirectStaysOnSite(t *testing.T) {
	base, _, _ := testConsole(t, Config{Users: testUsers(t)})
	hostile := []string{
		"//evil.com", "/\\evil.com", "\\\\evil.com", "/\t/evil.com", "/\n/evil.com", "/\r/evil.com",
		"/\x00/evil.com", "/\x0b/evil.com", "https://evil.com", "javascript:alert(1)",
		" //evil.com", "/\u00a0/evil.com", "",
	}
	for _, next := range hostile {
		c := newClient(t, base)
		req := url.Values{"csrf": {c.token("/login")}, "name": {"alice"}, "password": {"pw"}, "next": {next}}
		code, loc := c.raw(http.MethodPost, "/login", req)
		if code != http.StatusSeeOther || loc != "/review" {
			t.Errorf("next %q: status %d, Location %q; want 303 to /review", next, code, loc)
		}
		// signed in already: the sign-in page redirects by next as well
		if _, loc := c.raw(http.MethodGet, "/login?next="+url.QueryEscape(next), nil); loc != "/review" {
			t.Errorf("GET /login?next=%q when signed in: Location %q, want /review", next, loc)
		}
	}
	// a next on this site is kept
	c := newClient(t, base)
	if _, loc := c.raw(http.MethodPost, "/login", url.Values{"csrf": {c.token("/login")}, "name": {"alice"}, "password": {"pw"}, "next": {"/task?id=t-1"}}); loc != "/task?id=t-1" {
		t.Errorf("next /task?id=t-1: Location %q, want it kept", loc)
	}
}

// raw sends a request with the client's cookies and returns the status and
// the Location header as sent, without the client parsing it (Go's client
// refuses a Location a browser would follow).
func (c *client) raw(method, path string, form url.Values) (int, string) {
	c.t.Helper()
	req, _ := http.NewRequest(method, c.base+path, strings.NewReader(form.Encode()))
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for _, ck := range c.hc.Jar.Cookies(req.URL) {
		req.AddCookie(ck)
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		c.t.Fatal(err)
	}
	resp.Body.Close()
	if u, _ := url.Parse(c.base); u != nil {
		c.hc.Jar.SetCookies(u, resp.Cookies())
	}
	return resp.StatusCode, resp.Header.Get("Location")
}

// Guards the proxy identity: X-Forwarded-User and X-Forwarded-Email are
// believed only from a peer in the configured proxy CIDRs. From anyone else
// (a worker's pod, say) the header is stripped, the request is as anonymous
// as it is without it, and the refusal is logged and counted.
func TestProxyHeaderOnlyFromTrustedProxies(t *testing.T) {
	var logs lockedbuf.Buffer
	reg := prometheus.NewRegistry()
	// the test's requests come from 127.0.0.1, which is no proxy here
	base, _, _ := testConsole(t, Config{TrustProxy: true, Users: testUsers(t), TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		Registerer: reg, Log: slog.New(slog.NewTextHandler(&logs, nil))})
	for _, h := range []string{"X-Forwarded-User", "X-Forwarded-Email"} {
		req, _ := http.NewRequest(http.MethodGet, base+"/review", nil)
		req.Header.Set(h, "alice")
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/login") {
			t.Errorf("%s: alice from an untrusted address: status %d to %q, want 303 to the sign-in", h, resp.StatusCode, resp.Header.Get("Location"))
		}
	}
	if got := counterOf(t, reg, "faultrouter_console_proxy_header_refused_total"); got != 2 {
		t.Errorf("faultrouter_console_proxy_header_refused_total = %v, want 2", got)
	}
	if !strings.Contains(logs.String(), "proxy header refused") || !strings.Contains(logs.String(), "127.0.0.1") {
		t.Errorf("no log of the refused header naming the peer; logs:\n%s", logs.String())
	}

	// from the proxy's address the header is the person
	trusted, _, _ := testConsole(t, Config{TrustProxy: true, Users: testUsers(t), TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}})
	req, _ := http.NewRequest(http.MethodGet, trusted+"/review", nil)
	req.Header.Set("X-Forwarded-User", "alice")
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "alice") {
		t.Errorf("alice from the trusted proxy: status %d, want her page", resp.StatusCode)
	}

	// header mode without proxy addresses is refused, naming the flag
	err = (&Config{Listen: ":0", StateDir: "x", Kafka: []kgo.Opt{kgo.SeedBrokers("x")}, TrustProxy: true}).Validate()
	if err == nil || !strings.Contains(err.Error(), "--trusted-proxies") {
		t.Errorf("trust proxy without proxy addresses: %v, want an error naming --trusted-proxies", err)
	}
}

// counterOf is the counter name in reg, summed over its labels.
func counterOf(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// Guards the cookies and headers over HTTPS: when TLS ends at an ingress
// (PublicURL https://...) or at the console (TLSCert/TLSKey), the session,
// CSRF and device cookies are Secure, HttpOnly and SameSite=Strict, named
// with the __Host- prefix (Path=/, no Domain), and every
// response carries Strict-Transport-Security; the content security policy
// allows forms to post only to this site and no <base> element. Over plain
// HTTP (a laptop) the cookies cannot be Secure (nor, so, __Host-) and no
// HSTS is sent.
func TestCookiesSecureAndHSTSOverHTTPS(t *testing.T) {
	certFile, keyFile := selfSigned(t)
	for _, tc := range []struct {
		name   string
		cfg    Config
		secure bool
	}{
		{"plain http", Config{}, false},
		{"TLS at the ingress", Config{PublicURL: "https://console.example.com"}, true},
		{"TLS at the console", Config{TLSCert: certFile, TLSKey: keyFile}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Users = testUsers(t)
			base, _, _ := testConsole(t, tc.cfg)
			if tc.cfg.TLSCert != "" {
				base = strings.Replace(base, "http://", "https://", 1)
			}
			c := newClient(t, base)
			c.hc.Transport = &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}
			tok := c.token("/login")
			req, _ := http.NewRequest(http.MethodPost, base+"/login", strings.NewReader(url.Values{"csrf": {tok}, "name": {"alice"}, "password": {"pw"}}.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			resp, err := c.hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusSeeOther {
				t.Fatalf("sign-in: %d", resp.StatusCode)
			}
			got := map[string]*http.Cookie{}
			for _, ck := range resp.Cookies() {
				got[ck.Name] = ck
			}
			// over HTTPS every cookie carries the __Host- prefix: Secure, for
			// the whole site, and set by this host only
			prefix := ""
			if tc.secure {
				prefix = "__Host-"
			}
			if got[prefix+sessionCookie] == nil || got[prefix+deviceCookie] == nil {
				t.Fatalf("no %s and %s cookies in %v", prefix+sessionCookie, prefix+deviceCookie, resp.Header["Set-Cookie"])
			}
			for _, name := range []string{prefix + sessionCookie, prefix + nonceCookie, prefix + deviceCookie} {
				ck := got[name]
				if ck == nil {
					continue // the nonce was set on the sign-in page
				}
				if ck.Secure != tc.secure || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/" || ck.Domain != "" {
					t.Errorf("%s: Secure %v HttpOnly %v SameSite %v; want Secure %v, HttpOnly, Strict", name, ck.Secure, ck.HttpOnly, ck.SameSite, tc.secure)
				}
			}
			hsts := resp.Header.Get("Strict-Transport-Security")
			if tc.secure != strings.Contains(hsts, "max-age=") {
				t.Errorf("Strict-Transport-Security %q with secure %v", hsts, tc.secure)
			}
			csp := resp.Header.Get("Content-Security-Policy")
			for _, want := range []string{"form-action 'self'", "base-uri 'none'", "frame-ancestors 'none'"} {
				if !strings.Contains(csp, want) {
					t.Errorf("Content-Security-Policy %q lacks %s", csp, want)
				}
			}
		})
	}
	err := (&Config{Listen: ":0", StateDir: "x", Kafka: []kgo.Opt{kgo.SeedBrokers("x")}, Users: &Users{}, TLSCert: certFile}).Validate()
	if err == nil || !strings.Contains(err.Error(), "--http-tls-key") {
		t.Errorf("a certificate without a key: %v, want an error naming --http-tls-key", err)
	}
	err = (&Config{Listen: ":0", StateDir: "x", Kafka: []kgo.Opt{kgo.SeedBrokers("x")}, Users: &Users{}, PublicURL: "console.example.com"}).Validate()
	if err == nil || !strings.Contains(err.Error(), "--public-url") {
		t.Errorf("a public URL without a scheme: %v, want an error naming --public-url", err)
	}
}

// selfSigned writes a certificate for 127.0.0.1 and its key.
func selfSigned(t *testing.T) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "console"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
	return certFile, keyFile
}

// Guards the server against slow and idle callers: a request whose body
// never comes is cut off after ReadTimeout, while the live updates
// (server-sent events) outlive WriteTimeout because each write extends it.
func TestServerTimeouts(t *testing.T) {
	base, _, _ := testConsole(t, Config{Users: testUsers(t), ReadTimeout: 300 * time.Millisecond, WriteTimeout: 300 * time.Millisecond,
		IdleTimeout: 300 * time.Millisecond})
	addr := strings.TrimPrefix(base, "http://")
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// headers, then a body that never arrives
	fmt.Fprintf(conn, "POST /login HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 1000\r\n\r\nname=")
	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.ReadAll(conn); err != nil {
		t.Errorf("a request without its body: %v, want the server to close the connection", err)
	}

	c := newClient(t, base)
	c.login("alice")
	req, _ := http.NewRequest(http.MethodGet, base+"/events", nil)
	for _, ck := range c.hc.Jar.Cookies(req.URL) {
		req.AddCookie(ck)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	// read for more than three write timeouts: keep-alives keep coming
	var got bytes.Buffer
	deadline := time.Now().Add(time.Second)
	buf := make([]byte, 512)
	for time.Now().Before(deadline) {
		n, err := resp.Body.Read(buf)
		got.Write(buf[:n])
		if err != nil {
			t.Fatalf("the event stream ended after %q: %v", got.String(), err)
		}
	}
	if !strings.Contains(got.String(), "event: hello") || strings.Count(got.String(), "keep-alive") < 2 {
		t.Errorf("event stream %q: want hello and keep-alives", got.String())
	}
}

// Guards the sign-in secrets and errors: a session secret shorter than 32
// bytes is refused naming FAULTROUTER_CONSOLE_SECRET; a name that is not in
// the users file costs a bcrypt compare of the same cost as the users' own
// (the dummy hash is valid and of the highest cost in the file, so the time
// does not tell which names exist); an internal error reaches the log, not the page.
func TestSecretsCostsAndInternalErrors(t *testing.T) {
	err := (&Config{Listen: ":0", StateDir: "x", Kafka: []kgo.Opt{kgo.SeedBrokers("x")}, Users: &Users{}, Secret: []byte("too-short")}).Validate()
	if err == nil || !strings.Contains(err.Error(), "FAULTROUTER_CONSOLE_SECRET") || !strings.Contains(err.Error(), "32") {
		t.Errorf("a 9-byte secret: %v, want an error naming FAULTROUTER_CONSOLE_SECRET and 32 bytes", err)
	}
	users := testUsers(t) // hashes of bcrypt.MinCost
	cost, err := bcrypt.Cost(users.dummy())
	if err != nil || cost != bcrypt.MinCost {
		t.Errorf("dummy hash: cost %d, %v; want a valid hash of the users' cost %d", cost, err, bcrypt.MinCost)
	}
	if err := bcrypt.CompareHashAndPassword(users.dummy(), []byte("pw")); !errors.Is(err, bcrypt.ErrMismatchedHashAndPassword) {
		t.Errorf("comparing with the dummy hash: %v, want a mismatch after the full compare", err)
	}

	var logs lockedbuf.Buffer
	s := &Server{cfg: Config{}, log: slog.New(slog.NewTextHandler(&logs, nil)), met: newMetrics(nil)}
	ps, err := parsePages()
	if err != nil {
		t.Fatal(err)
	}
	s.pages, s.secret = ps, make([]byte, 32)
	w := httptest.NewRecorder()
	s.fail(w, httptest.NewRequest(http.MethodGet, "/review", nil), nil, errors.New("pebble: /var/lib/secret-path corrupt"))
	if w.Code != http.StatusInternalServerError || strings.Contains(w.Body.String(), "secret-path") {
		t.Errorf("internal error page: %d, shows the error: %v", w.Code, strings.Contains(w.Body.String(), "secret-path"))
	}
	if !strings.Contains(logs.String(), "secret-path") {
		t.Errorf("the internal error is not logged: %s", logs.String())
	}
}

// Guards sign-in against guessing: failures are limited per name and per
// client address within a window; beyond the limit the answer is 429 with
// Retry-After, before any password is compared (a flood costs no bcrypt),
// even for the right password. Another name from the same address is still
// let in until the address's own limit. Each failure is logged and counted.
func TestLoginThrottledPerUserAndAddress(t *testing.T) {
	var logs lockedbuf.Buffer
	reg := prometheus.NewRegistry()
	base, _, _ := testConsole(t, Config{Users: testUsers(t), LoginFailuresPerUser: 3, LoginFailuresPerAddress: 6,
		Registerer: reg, Log: slog.New(slog.NewTextHandler(&logs, nil))})
	try := func(name, pw string) (int, string) {
		c := newClient(t, base)
		req, _ := http.NewRequest(http.MethodPost, base+"/login", strings.NewReader(url.Values{"csrf": {c.token("/login")}, "name": {name}, "password": {pw}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		resp, err := c.hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Retry-After")
	}
	for i := 0; i < 3; i++ {
		if code, _ := try("alice", "guess"); code != http.StatusUnauthorized {
			t.Fatalf("wrong password %d: %d, want 401", i+1, code)
		}
	}
	code, retry := try("alice", "pw")
	if code != http.StatusTooManyRequests || retry == "" || retry == "0" {
		t.Errorf("alice after 3 failures, right password: %d Retry-After %q; want 429 with a Retry-After", code, retry)
	}
	if code, _ := try("victor", "pw"); code != http.StatusSeeOther {
		t.Errorf("victor from the same address: %d, want 303 (signed in)", code)
	}
	for i := 0; i < 3; i++ {
		try(fmt.Sprintf("nobody-%d", i), "guess")
	}
	if code, retry := try("victor", "pw"); code != http.StatusTooManyRequests || retry == "" {
		t.Errorf("victor after 6 failures from his address: %d Retry-After %q; want 429", code, retry)
	}
	if got := counterOf(t, reg, "faultrouter_console_login_failures_total"); got != 6 {
		t.Errorf("faultrouter_console_login_failures_total = %v, want 6", got)
	}
	if got := counterOf(t, reg, "faultrouter_console_login_throttled_total"); got != 2 {
		t.Errorf("faultrouter_console_login_throttled_total = %v, want 2", got)
	}
	if !strings.Contains(logs.String(), "sign-in failed") || !strings.Contains(logs.String(), "user=alice") {
		t.Errorf("failed sign-ins are not logged with the name:\n%s", logs.String())
	}
}
