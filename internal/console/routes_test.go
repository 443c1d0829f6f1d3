package console

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// Guards every state-changing route, taken from the route table itself so
// that a new route is covered the day it is added: each declares the role
// it needs; without a session it is refused (401), without a CSRF token or
// with another person's token it is refused (403), and a person without its
// role is refused (403 naming the role), each before anything is written.
func TestEveryStateChangingRouteRefusesWithoutSessionCSRFOrRole(t *testing.T) {
	h := pwHash()
	users := &Users{Users: []User{
		{Name: "olga", PasswordBcrypt: string(h), Roles: []string{RoleViewer, RoleReviewer, RoleOperator}, Owners: []string{"*"}},
		{Name: "alice", PasswordBcrypt: string(h), Roles: []string{RoleReviewer}, Owners: []string{"ai_product"}},
		{Name: "victor", PasswordBcrypt: string(h), Roles: []string{RoleViewer}},
	}}
	base, _, _ := testConsole(t, Config{Users: users})
	clients := map[string]*client{}
	for _, n := range []string{"olga", "alice", "victor"} {
		clients[n] = newClient(t, base)
		clients[n].login(n)
	}
	// lacking names a person without the role
	lacking := map[string]string{RoleReviewer: "victor", RoleOperator: "alice"}
	s := &Server{}
	n := 0
	for _, rt := range s.routeTable() {
		if rt.method == http.MethodGet {
			continue
		}
		n++
		path := strings.NewReplacer("{id}", "r1", "{op}", "stop").Replace(rt.path)
		form := url.Values{"task": {"t-1"}, "action": {"approve"}, "reason": {"x"}, "owner": {"ai_product"},
			"scope": {"PROVIDER_MODEL"}, "key": {"p/m"}, "select": {"filter"}}
		t.Run(rt.method+" "+rt.path, func(t *testing.T) {
			switch rt.role {
			case RoleSignedIn, RoleReviewer, RoleOperator:
			default:
				t.Fatalf("the route declares role %q: want %s, %s or %s", rt.role, RoleSignedIn, RoleReviewer, RoleOperator)
			}
			anon := newClient(t, base)
			if code, body := anon.do(rt.method, path, form); code != http.StatusUnauthorized {
				t.Errorf("without a session: %d, want 401: %s", code, pageError(body))
			}
			if code, body := clients["olga"].do(rt.method, path, form); code != http.StatusForbidden || !strings.Contains(body, "CSRF") {
				t.Errorf("without a CSRF token: %d, want 403 naming CSRF: %s", code, pageError(body))
			}
			other := url.Values{}
			for k, v := range form {
				other[k] = v
			}
			other.Set("csrf", clients["victor"].token("/review"))
			if code, body := clients["olga"].do(rt.method, path, other); code != http.StatusForbidden || !strings.Contains(body, "CSRF") {
				t.Errorf("with another person's CSRF token: %d, want 403 naming CSRF: %s", code, pageError(body))
			}
			if who := lacking[rt.role]; who != "" {
				c := clients[who]
				withTok := url.Values{}
				for k, v := range form {
					withTok[k] = v
				}
				withTok.Set("csrf", c.token("/review"))
				if code, body := c.do(rt.method, path, withTok); code != http.StatusForbidden || !strings.Contains(body, rt.role) {
					t.Errorf("%s without the %s role: %d, want 403 naming the role: %s", who, rt.role, code, pageError(body))
				}
			}
		})
	}
	if n < 6 {
		t.Errorf("%d state-changing routes in the table, want at least 6 (logout, decide, bulk, reset, re-drive, job control)", n)
	}
}

// pageError is the message of an error page, or the start of the body.
func pageError(body string) string {
	if i := strings.Index(body, `class="error"`); i >= 0 {
		body = body[i:]
	}
	if len(body) > 300 {
		body = body[:300]
	}
	return body
}
