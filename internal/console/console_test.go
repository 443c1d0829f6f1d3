package console

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/netip"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/crypto/bcrypt"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// testConsole runs a console on an embedded broker with two open review
// items (t-1 of ai_product, t-2 of security) and returns its URL, the
// broker's client options and the topic names.
func testConsole(t *testing.T, cfg Config) (string, []kgo.Opt, topicspec.Set) {
	t.Helper()
	opts, set := testCluster(t)
	base, _ := startConsole(t, opts, set, cfg)
	return base, opts, set
}

// startConsole runs a console with cfg on the cluster of opts and returns
// its URL and server.
func startConsole(t *testing.T, opts []kgo.Opt, set topicspec.Set, cfg Config) (string, *Server) {
	t.Helper()
	cfg.Listen, cfg.StateDir, cfg.Kafka, cfg.Topics = "127.0.0.1:0", t.TempDir(), opts, set
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(rctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
	return "http://" + ln.Addr().String(), s
}

// testCluster is an embedded broker with the topics and three open review
// items: t-1 and t-3 of ai_product, t-2 of security.
func testCluster(t *testing.T) ([]kgo.Opt, topicspec.Set) {
	t.Helper()
	_, opts, set := testKfake(t)
	return opts, set
}

// testKfake is testCluster with its embedded broker.
func testKfake(t *testing.T) (*kfake.Cluster, []kgo.Opt, topicspec.Set) {
	t.Helper()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	opts := []kgo.Opt{kgo.SeedBrokers(cluster.ListenAddrs()...)}
	set, err := topicspec.Load("")
	if err != nil {
		t.Fatal(err)
	}
	set = set.WithPartitions(2)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	if _, err := set.Apply(ctx, kadm.NewClient(cl)); err != nil {
		t.Fatal(err)
	}
	c, _ := codec.New()
	review, _ := set.Name("review")
	for task, owner := range map[string]string{"t-1": "ai_product", "t-2": "security", "t-3": "ai_product"} {
		v, err := c.EncodeRouted(nil, &event.Routed{
			Event: &event.TaskEvent{EventID: "e-" + task, TaskID: task, Attempt: 1, OccurredAt: event.At(time.Now()), Source: "test", Action: "refund", Status: event.StatusError,
				InputRef: &event.InputRef{URI: "s3://inputs/" + task + ".pdf"}},
			Decision: event.Decision{Class: event.ClassModelRefusal, Route: event.RouteReview, Rule: "test", Reason: "refused",
				Review: &event.Review{Owner: owner, SLAMs: 60_000}, DecidedAt: event.At(time.Now())}})
		if err != nil {
			t.Fatal(err)
		}
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: review, Key: []byte(task), Value: v}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	return cluster, opts, set
}

// TestMain lets the tests' users files hold cheap hashes: a sign-in at
// MinBcryptCost takes long enough under the race detector on a busy
// machine to outlast the short server timeouts some tests set.
// TestUsersFileRefusesCheapHashes checks MinBcryptCost itself.
func TestMain(m *testing.M) {
	minBcryptCost = bcrypt.MinCost
	os.Exit(m.Run())
}

// pwHash is the bcrypt hash of "pw", made once for the package's tests.
var pwHash = sync.OnceValue(func() []byte {
	h, err := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	if err != nil {
		panic(err)
	}
	return h
})

func testUsers(t *testing.T) *Users {
	h := pwHash()
	u := &Users{Users: []User{
		{Name: "alice", PasswordBcrypt: string(h), Roles: []string{RoleReviewer}, Owners: []string{"ai_product"}},
		{Name: "victor", PasswordBcrypt: string(h), Roles: []string{RoleViewer}},
	}}
	if err := u.Validate(); err != nil {
		t.Fatal(err)
	}
	return u
}

type client struct {
	t    *testing.T
	base string
	hc   *http.Client
	lang string
}

func newClient(t *testing.T, base string) *client {
	jar, _ := cookiejar.New(nil)
	return &client{t: t, base: base, hc: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (c *client) do(method, path string, form url.Values) (int, string) {
	c.t.Helper()
	contentType := ""
	if method == http.MethodPost {
		contentType = "application/x-www-form-urlencoded"
	}
	return c.doBody(method, path, contentType, strings.NewReader(form.Encode()))
}

// doBody sends a request with a body of its own content type ("" for
// none).
func (c *client) doBody(method, path, contentType string, body io.Reader) (int, string) {
	c.t.Helper()
	req, _ := http.NewRequest(method, c.base+path, body)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if c.lang != "" {
		req.Header.Set("Accept-Language", c.lang)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

var tokenRe = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

func (c *client) token(path string) string {
	c.t.Helper()
	_, body := c.do(http.MethodGet, path, nil)
	m := tokenRe.FindStringSubmatch(body)
	if m == nil {
		c.t.Fatalf("no CSRF token on %s", path)
	}
	return m[1]
}

func (c *client) login(name string) {
	c.t.Helper()
	if code, _ := c.do(http.MethodPost, "/login", url.Values{"csrf": {c.token("/login")}, "name": {name}, "password": {"pw"}}); code != http.StatusSeeOther {
		c.t.Fatalf("login %s: %d", name, code)
	}
}

// Guards the console's refusals and its one write path: nothing without a
// session; no state change without a CSRF token; a wrong password, a viewer,
// a reviewer of other owners, an unknown task and a missing reason each get
// a clear message and the right status, never a 500; an allowed approval
// writes one ReviewDecision naming the reviewer, and a second decision on the
// same item is refused before it reaches Kafka; a bulk decision previews the
// count of what the filter selects and the reviewer may decide, and writes
// only once its preview is confirmed.
func TestDecisionsAreRefusedOrWrittenOnce(t *testing.T) {
	base, opts, set := testConsole(t, Config{Users: testUsers(t)})
	anon := newClient(t, base)
	if code, _ := anon.do(http.MethodGet, "/review", nil); code != http.StatusSeeOther {
		t.Errorf("GET /review without a session: %d, want 303", code)
	}
	if code, _ := anon.do(http.MethodPost, "/login", url.Values{"csrf": {anon.token("/login")}, "name": {"alice"}, "password": {"wrong"}}); code != http.StatusUnauthorized {
		t.Errorf("wrong password: %d, want 401", code)
	}
	alice := newClient(t, base)
	alice.login("alice")
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, body := alice.do(http.MethodGet, "/review", nil); strings.Contains(body, `data-task="t-1"`) && strings.Contains(body, `data-task="t-2"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the queue never showed t-1 and t-2")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, body := alice.do(http.MethodGet, "/review", nil); !strings.Contains(body, "s3://inputs/t-1.pdf") {
		t.Errorf("the queue does not show t-1's input snapshot s3://inputs/t-1.pdf")
	}
	tok := alice.token("/review")
	// a token that differs from the real one in its first character
	badTok := "0" + tok[1:]
	if tok[0] == '0' {
		badTok = "1" + tok[1:]
	}
	cases := []struct {
		name   string
		who    *client
		form   url.Values
		status int
		msg    string
	}{
		{"no csrf", alice, url.Values{"task": {"t-1"}, "action": {"approve"}, "reason": {"ok"}}, 403, "CSRF"},
		{"bad csrf", alice, url.Values{"csrf": {badTok}, "task": {"t-1"}, "action": {"approve"}, "reason": {"ok"}}, 403, "CSRF"},
		{"missing reason", alice, url.Values{"csrf": {tok}, "task": {"t-1"}, "action": {"approve"}}, 400, "reason is required"},
		{"unknown task", alice, url.Values{"csrf": {tok}, "task": {"t-nope"}, "action": {"approve"}, "reason": {"ok"}}, 404, "Unknown task"},
		{"other owner", alice, url.Values{"csrf": {tok}, "task": {"t-2"}, "action": {"approve"}, "reason": {"ok"}}, 403, "belongs to owner security"},
		{"bad action", alice, url.Values{"csrf": {tok}, "task": {"t-1"}, "action": {"delete"}, "reason": {"ok"}}, 400, "Unknown action"},
	}
	victor := newClient(t, base)
	victor.login("victor")
	cases = append(cases, struct {
		name   string
		who    *client
		form   url.Values
		status int
		msg    string
	}{"viewer", victor, url.Values{"csrf": {victor.token("/review")}, "task": {"t-1"}, "action": {"approve"}, "reason": {"ok"}}, 403, "view only"})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, body := tc.who.do(http.MethodPost, "/review/decide", tc.form)
			if code != tc.status || !strings.Contains(body, tc.msg) {
				t.Errorf("status %d, want %d with %q; body:\n%s", code, tc.status, tc.msg, body)
			}
		})
	}
	if code, _ := alice.do(http.MethodPost, "/review/decide", url.Values{"csrf": {tok}, "task": {"t-1"}, "action": {"approve"}, "reason": {"looks right"}}); code != http.StatusSeeOther {
		t.Fatalf("approve t-1: %d, want 303", code)
	}
	code, body := alice.do(http.MethodPost, "/review/decide", url.Values{"csrf": {tok}, "task": {"t-1"}, "action": {"reject"}, "reason": {"changed my mind"}, "confirm": {"1"}})
	if code != http.StatusConflict || !strings.Contains(body, "alice already decided task t-1") {
		t.Errorf("second decision: %d, want 409 naming alice; body:\n%s", code, body)
	}

	// bulk: the filter ai_product holds t-1 (decided already) and t-3
	bulk := url.Values{"csrf": {tok}, "owner": {"ai_product"}, "action": {"approve"}, "reason": {"batch fixed"}}
	code, body = alice.do(http.MethodPost, "/review/bulk", bulk)
	if code != http.StatusOK || !regexp.MustCompile(`id="bulk-count">[^<]*<b>1</b>`).MatchString(body) || !strings.Contains(body, "t-3") {
		t.Fatalf("bulk preview: %d, want a count of 1 (t-3); body:\n%s", code, body)
	}
	if code, body = alice.do(http.MethodPost, "/review/bulk", confirmation(t, body, "/review/bulk", url.Values{"action": {"approve"}})); code != http.StatusSeeOther {
		t.Fatalf("bulk confirm: %d; body:\n%s", code, body)
	}

	// alice's approval of t-1 and the bulk approval of t-3 reached Kafka
	decisions, _ := set.Name("decisions")
	cl, err := kgo.NewClient(append(opts, kgo.ConsumeTopics(decisions), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	c, _ := codec.New()
	var got []event.ReviewDecision
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			if d, err := c.DecodeReviewDecision(r.Value); err == nil {
				got = append(got, d)
			}
		})
	}
	byTask := map[string]event.ReviewDecision{}
	for _, d := range got {
		byTask[d.TaskID] = d
	}
	if len(got) != 2 || byTask["t-1"].Reason != "looks right" || byTask["t-3"].Reason != "batch fixed" ||
		byTask["t-1"].Reviewer != "alice" || !byTask["t-1"].Approve || !byTask["t-3"].Approve {
		t.Errorf("decisions on Kafka: %+v, want alice's approvals of t-1 and t-3", got)
	}

	// the page speaks Chinese to a browser that asks for it
	alice.lang = "zh-CN,zh;q=0.9,en;q=0.8"
	if _, body := alice.do(http.MethodGet, "/review", nil); !strings.Contains(body, "审核队列") {
		t.Errorf("zh page lacks 审核队列")
	}
}

// Guards authentication: a tampered session cookie is no session, the
// proxy header is ignored unless trusted, and a users file with an unknown
// role or a reviewer without owners is refused with the field named.
func TestAuthentication(t *testing.T) {
	base, _, _ := testConsole(t, Config{Users: testUsers(t)})
	req, _ := http.NewRequest(http.MethodGet, base+"/review", nil)
	req.Header.Set("X-Forwarded-User", "alice")
	req.AddCookie(&http.Cookie{Name: sessionCookie, Value: "YWxpY2V8OTk5OTk5OTk5OXxmb3JnZWQ"}) // alice|9999999999|forged
	resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Errorf("forged cookie and an untrusted proxy header: %d, want 303 to the sign-in", resp.StatusCode)
	}

	trusted, _, _ := testConsole(t, Config{TrustProxy: true, TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	req, _ = http.NewRequest(http.MethodGet, trusted+"/review", nil)
	req.Header.Set("X-Forwarded-Email", "ops@example.com")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "ops@example.com") || strings.Contains(string(b), `value="approve"`) {
		t.Errorf("trusted proxy header: %d, want the page for ops@example.com as a viewer", resp.StatusCode)
	}

	for _, tc := range []struct {
		u    User
		want string
	}{
		{User{Name: "a", Roles: []string{"admin"}}, "roles"},
		{User{Name: "a", Roles: []string{RoleReviewer}}, "owners"},
		{User{Name: "a", Roles: []string{RoleViewer}, PasswordBcrypt: "plain"}, "password_bcrypt"},
		{User{Roles: []string{RoleViewer}}, "name"},
	} {
		err := (&Users{Users: []User{tc.u}}).Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("users %+v: %v, want an error naming %s", tc.u, err, tc.want)
		}
	}
	if err := (&Config{Listen: ":0", StateDir: "x", Kafka: []kgo.Opt{kgo.SeedBrokers("x")}}).Validate(); err == nil || !strings.Contains(err.Error(), "authentication") {
		t.Errorf("a console without users or proxy: %v, want it refused", err)
	}
}
