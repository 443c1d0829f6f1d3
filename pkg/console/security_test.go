package console

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
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
	var logs syncBuf
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

// syncBuf is a log buffer safe for the server's goroutines.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
