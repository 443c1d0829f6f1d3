package console

// handlers.go: the routes, the sign-in, and the one way a page is rendered.
// A handler that meets bad input (unknown task, item already decided,
// missing reason) renders the page with the message; nothing a person types
// ends in a 500.

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"mime"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"
)

// userError is a message for the person, shown on the page with a status.
type userError struct {
	Status int
	Msg    string
}

func (e *userError) Error() string { return e.Msg }

func badRequest(msg string) error { return &userError{Status: http.StatusBadRequest, Msg: msg} }
func forbidden(msg string) error  { return &userError{Status: http.StatusForbidden, Msg: msg} }
func conflict(msg string) error   { return &userError{Status: http.StatusConflict, Msg: msg} }
func notFound(msg string) error   { return &userError{Status: http.StatusNotFound, Msg: msg} }

// needOperator refuses p, naming what p tried (a gerund: "re-driving") and
// the roles p has, unless p has the operator role.
func needOperator(p *person, what string) error {
	if p.operator() {
		return nil
	}
	return forbidden(fmt.Sprintf("Refused: %s needs the operator role; %s has %s.", what, p.Name, strings.Join(p.Roles, ", ")))
}

// pageFunc handles one signed-in request.
type pageFunc func(w http.ResponseWriter, r *http.Request, p *person) error

// RoleSignedIn is the role of a route anyone signed in may use.
const RoleSignedIn = "signed-in"

// route is one signed-in route and the role it needs.
type route struct {
	method, path string
	role         string // RoleSignedIn, RoleReviewer or RoleOperator
	h            pageFunc
}

// routeTable is every route that needs a person. Every state-changing one
// is checked for its session, CSRF token and role before its handler runs.
func (s *Server) routeTable() []route {
	return []route{
		{"POST", "/logout", RoleSignedIn, s.logoutPost},
		{"GET", "/{$}", RoleSignedIn, func(w http.ResponseWriter, r *http.Request, p *person) error {
			http.Redirect(w, r, "/review", http.StatusSeeOther)
			return nil
		}},
		{"GET", "/events", RoleSignedIn, func(w http.ResponseWriter, r *http.Request, p *person) error {
			s.events(w, r, p)
			return nil
		}},
		{"GET", "/review", RoleSignedIn, s.reviewPage},
		{"POST", "/review/decide", RoleReviewer, s.reviewDecide},
		{"POST", "/review/bulk", RoleReviewer, s.reviewBulk},
		{"POST", "/review/claim", RoleReviewer, s.reviewClaim}, // claims.go
		{"POST", "/review/assign", RoleOperator, s.reviewAssign},
		{"GET", "/task", RoleSignedIn, s.timelinePage},
		{"GET", "/breakers", RoleSignedIn, s.breakersPage},
		{"POST", "/breakers/reset", RoleOperator, s.breakerReset},
		{"GET", "/deadletter", RoleSignedIn, s.deadLetterPage},
		{"GET", "/deadletter/raw", RoleSignedIn, s.deadLetterRaw},
		{"POST", "/deadletter/redrive", RoleOperator, s.redrivePost},
		{"POST", "/deadletter/jobs/{id}/{op}", RoleOperator, s.jobControl},
		{"GET", "/alerts", RoleSignedIn, s.alertsPage},
		{"GET", "/cost", RoleSignedIn, s.costPage},     // cost.go
		{"GET", "/whatif", RoleSignedIn, s.whatifForm}, // whatif.go
		{"POST", "/whatif", RoleOperator, s.whatifRun},
		{"GET", "/advise", RoleSignedIn, s.adviseForm}, // advise.go
		{"POST", "/advise", RoleOperator, s.adviseRun},
		{"GET", "/operators", RoleSignedIn, s.operatorsPage},
	}
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(assets, "static")
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /login", s.loginPage)
	mux.HandleFunc("POST /login", s.loginPost)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok\n")) })
	for _, rt := range s.routeTable() {
		mux.Handle(rt.method+" "+rt.path, s.signedIn(rt.role, rt.h))
	}
	return s.securityHeaders(s.stripProxyHeaders(mux))
}

func (s *Server) logoutPost(w http.ResponseWriter, r *http.Request, p *person) error {
	s.clearSession(w, r)
	if p.Session != "" {
		if err := s.logout(r.Context(), p, r.PostFormValue("all") != ""); err != nil {
			return err
		}
	}
	http.Redirect(w, r, "/login", http.StatusSeeOther)
	return nil
}

// proxyHeaders name the person behind a trusted proxy.
var proxyHeaders = []string{"X-Forwarded-User", "X-Forwarded-Email"}

// stripProxyHeaders removes the identity headers from every request whose
// direct peer is not a trusted proxy, logging and counting each refusal in
// header mode.
func (s *Server) stripProxyHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.fromTrustedProxy(r) {
			h.ServeHTTP(w, r)
			return
		}
		for _, name := range proxyHeaders {
			v := r.Header.Get(name)
			if v == "" {
				continue
			}
			r.Header.Del(name)
			if s.cfg.TrustProxy {
				s.met.proxyRefused.Inc()
				s.log.Warn("console: proxy header refused: the peer is not a trusted proxy", "header", name, "claimed", v,
					"peer", r.RemoteAddr, "path", r.URL.Path)
			}
		}
		h.ServeHTTP(w, r)
	})
}

// fromTrustedProxy reports whether the request's direct peer is in the
// trusted proxies of header mode.
func (s *Server) fromTrustedProxy(r *http.Request) bool {
	if !s.cfg.TrustProxy {
		return false
	}
	a, ok := peerAddr(r)
	return ok && s.trusted(a)
}

func (s *Server) trusted(a netip.Addr) bool {
	for _, p := range s.cfg.TrustedProxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

func peerAddr(r *http.Request) (netip.Addr, bool) {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}, false
	}
	return ap.Addr().Unmap(), true
}

// csp: no script, style or form target but our own, no <base>, no framing.
const csp = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; " +
	"form-action 'self'; base-uri 'none'; frame-ancestors 'none'; object-src 'none'"

// securityHeaders: no framing, no sniffing, no script but our own; over
// HTTPS, HSTS.
func (s *Server) securityHeaders(h http.Handler) http.Handler {
	https := s.cfg.https()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Frame-Options", "DENY")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Content-Security-Policy", csp)
		w.Header().Set("Referrer-Policy", "same-origin")
		if https {
			w.Header().Set("Strict-Transport-Security", "max-age=31536000")
		}
		h.ServeHTTP(w, r)
	})
}

// signedIn refuses a request without an identity (a page is redirected to
// the sign-in), a state-changing request without a valid CSRF token, and a
// person without the route's role.
func (s *Server) signedIn(role string, fn pageFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := s.identify(w, r)
		if p == nil {
			if r.Method == http.MethodGet && r.URL.Path != "/events" {
				http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			s.fail(w, r, nil, &userError{Status: http.StatusUnauthorized, Msg: "Sign in first: this request carries no valid session."})
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
			if err := parseForm(r); err != nil {
				s.fail(w, r, p, badRequest("The form could not be read: "+err.Error()))
				return
			}
			if !s.csrfOK(r, p) {
				s.fail(w, r, p, forbidden("Refused: the request carries no valid CSRF token. Reload the page and try again."))
				return
			}
		}
		if role != RoleSignedIn && !p.has(role) {
			s.fail(w, r, p, forbidden(fmt.Sprintf("Refused: this needs the %s role; %s has %s (view only without reviewer or operator).",
				role, p.Name, strings.Join(p.Roles, ", "))))
			return
		}
		if err := fn(w, r, p); err != nil {
			s.fail(w, r, p, err)
		}
	})
}

// maxFormBytes bounds the body of a state-changing request: a form, or a
// multipart form with an uploaded file (the What-if page's candidate
// policy).
const maxFormBytes = 1 << 20

// parseForm parses a request's form: URL-encoded, or multipart (held in
// memory whole: the body is at most maxFormBytes, so no file part ever goes
// to disk).
func parseForm(r *http.Request) error {
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt == "multipart/form-data" {
		return r.ParseMultipartForm(maxFormBytes)
	}
	return r.ParseForm()
}

// fail renders err on an error page; only a bug is a 500.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, p *person, err error) {
	var ue *userError
	if !errors.As(err, &ue) {
		ref := make([]byte, 4)
		rand.Read(ref)
		id := hex.EncodeToString(ref)
		s.log.Error("console: request failed", "path", r.URL.Path, "ref", id, "err", err)
		ue = &userError{Status: http.StatusInternalServerError,
			Msg: "Something went wrong on the console's side. It is logged with reference " + id + "; please pass it on to the operators."}
	}
	s.render(w, r, p, "error", ue.Status, "Error", "", map[string]any{"Message": ue.Msg})
}

// page is what every template gets.
type page struct {
	Title    string
	Nav      string
	Me       *person
	CSRF     string
	Lang     string
	Flash    *flash
	Progress map[string]any
	Now      time.Time
	Data     any
}

func (s *Server) render(w http.ResponseWriter, r *http.Request, p *person, name string, status int, title, nav string, data any) {
	read, total, caughtUp, perr := s.prog.snapshot()
	pg := page{Title: title, Nav: nav, Me: p, CSRF: s.csrfToken(w, r, p), Lang: lang(r), Now: time.Now(), Data: data,
		Flash:    flashOf(s.takeFlash(w, r)),
		Progress: map[string]any{"Read": read, "Total": total, "CaughtUp": caughtUp, "Error": perr}}
	t, err := s.pages.get(name, pg.Lang)
	var buf bytes.Buffer
	if err == nil {
		err = t.ExecuteTemplate(&buf, "layout", pg)
	}
	if err != nil {
		s.log.Error("console: template", "page", name, "err", err)
		http.Error(w, "Something went wrong on the console's side; it is logged.", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(buf.Bytes())
}

// safeNext keeps a redirect on this site: a path of printable ASCII that
// starts with one slash. Browsers drop tabs and newlines from a URL and read
// a backslash as a slash, so anything else ("/\t/evil.com") could name
// another host.
func safeNext(next string) string {
	const home = "/review"
	if len(next) < 1 || next[0] != '/' || (len(next) > 1 && (next[1] == '/' || next[1] == '\\')) {
		return home
	}
	for i := 0; i < len(next); i++ {
		if c := next[i]; c <= ' ' || c >= 0x7f || c == '\\' {
			return home
		}
	}
	if u, err := url.Parse(next); err != nil || u.Scheme != "" || u.Host != "" || u.Opaque != "" {
		return home
	}
	return next
}

// pages are the parsed templates: each page with the layout.
type pages map[string]*template.Template

var pageNames = []string{"login", "error", "review", "confirm", "timeline", "breakers", "deadletter", "alerts", "cost", "whatif", "advise", "operators"}

func parsePages() (pages, error) {
	ps := pages{}
	for _, n := range pageNames {
		t, err := template.New(n).Funcs(funcs).Funcs(template.FuncMap{"t": translator("en")}).
			ParseFS(assets, "templates/layout.html", "templates/"+n+".html")
		if err != nil {
			return nil, err
		}
		ps[n] = t
	}
	return ps, nil
}

// get returns the page with t in lang.
func (ps pages) get(name, lang string) (*template.Template, error) {
	t, err := ps[name].Clone()
	if err != nil {
		return nil, err
	}
	return t.Funcs(template.FuncMap{"t": translator(lang)}), nil
}

const flashCookie = "frc_flash"

// done redirects a state-changing request to path and leaves its outcome
// (done=..., task=..., n=...) for the next page's banner in a short-lived
// cookie signed with the console's secret: a link cannot put words in the
// banner.
func (s *Server) done(w http.ResponseWriter, r *http.Request, path string, outcome url.Values) {
	v := base64.RawURLEncoding.EncodeToString([]byte(outcome.Encode()))
	http.SetCookie(w, &http.Cookie{Name: s.cookieName(flashCookie), Value: v + "." + hex.EncodeToString(s.mac("flash", v)), Path: "/",
		MaxAge: 60, HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: s.secure(r)})
	http.Redirect(w, r, path, http.StatusSeeOther)
}

// takeFlash returns the outcome the last redirect left, and clears it.
func (s *Server) takeFlash(w http.ResponseWriter, r *http.Request) url.Values {
	c, err := r.Cookie(s.cookieName(flashCookie))
	if err != nil {
		return nil
	}
	http.SetCookie(w, &http.Cookie{Name: s.cookieName(flashCookie), Value: "", Path: "/", MaxAge: -1, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: s.secure(r)})
	v, sig, ok := strings.Cut(c.Value, ".")
	if !ok || !hmac.Equal([]byte(sig), []byte(hex.EncodeToString(s.mac("flash", v)))) {
		return nil
	}
	b, err := base64.RawURLEncoding.DecodeString(v)
	if err != nil {
		return nil
	}
	q, _ := url.ParseQuery(string(b))
	return q
}
