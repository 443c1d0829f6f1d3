package console

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
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
