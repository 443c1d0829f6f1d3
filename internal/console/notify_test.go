package console

import (
	"context"
	"encoding/json"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// Guards the webhooks file: a URL other than http(s) with a host, an
// unknown field and a missing owner map are refused with a message naming
// the field; a good file gets its defaults.
func TestWebhooksFileRefusesBadURLs(t *testing.T) {
	dir := t.TempDir()
	cases := []struct{ name, yaml, want string }{
		{"file scheme", "owners: {ai_product: 'file:///etc/passwd'}", `webhooks.owners.ai_product: scheme "file": allowed http, https`},
		{"javascript", "owners: {ai_product: 'javascript:alert(1)'}", `scheme "javascript": allowed http, https`},
		{"gopher", "owners: {security: 'gopher://127.0.0.1:70/'}", `webhooks.owners.security: scheme "gopher"`},
		{"no host", "owners: {security: 'https:///hooks'}", "webhooks.owners.security: the URL names no host"},
		{"no owners", "timeout: 1s", "webhooks.owners: at least one owner"},
		{"unknown field", "owners: {a: 'https://x'}\nretries: 3", "field retries not found"},
		{"attempts", "owners: {a: 'https://x'}\nattempts: 99", "webhooks.attempts 99: allowed 1 to 20"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "_")+".yaml")
			os.WriteFile(f, []byte(c.yaml), 0o600)
			if _, err := LoadWebhooks(f); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want one saying %q", err, c.want)
			}
		})
	}
	f := filepath.Join(dir, "good.yaml")
	os.WriteFile(f, []byte("owners: {ai_product: 'https://hooks.example.com/T1/B2/secret', '*': 'http://127.0.0.1:9/x'}\n"), 0o600)
	w, err := LoadWebhooks(f)
	if err != nil {
		t.Fatal(err)
	}
	if w.Timeout != 5*time.Second || w.Attempts != 5 || w.Backoff != time.Second || w.Check != 30*time.Second {
		t.Errorf("defaults %+v, want timeout 5s, 5 attempts, backoff 1s, check 30s", w)
	}
}

// receiver is a local webhook receiver that records what it gets.
type receiver struct {
	*httptest.Server
	mu     sync.Mutex
	bodies []string
}

func newReceiver(t *testing.T, h func(n int, w http.ResponseWriter, r *http.Request)) *receiver {
	rc := &receiver{}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		rc.bodies = append(rc.bodies, string(b))
		n := len(rc.bodies)
		rc.mu.Unlock()
		h(n, w, r)
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *receiver) got() []string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]string(nil), rc.bodies...)
}

// produceReview writes a review record of task for owner with a priority
// and an SLA.
func produceReview(t *testing.T, opts []kgo.Opt, review, task, owner, priority string, sla time.Duration) {
	t.Helper()
	produceDecision(t, opts, review, task, event.Decision{Class: event.ClassBudgetExhausted, Route: event.RouteReview, Rule: "test", Reason: "over budget <b>&</b>",
		Review: &event.Review{Owner: owner, SLAMs: sla.Milliseconds(), Priority: priority}})
}

// produceDecision writes a routed record of task with decision d, decided
// now, to topic.
func produceDecision(t *testing.T, opts []kgo.Opt, topic, task string, d event.Decision) {
	t.Helper()
	c, _ := codec.New()
	d.DecidedAt = event.At(time.Now())
	v, err := c.EncodeRouted(nil, &event.Routed{
		Event:    &event.TaskEvent{EventID: "e-" + task, TaskID: task, Attempt: 1, OccurredAt: event.At(time.Now()), Source: "test", Action: "refund", Status: event.StatusError},
		Decision: d})
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: topic, Key: []byte(task), Value: v}).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// Guards the owners' webhooks against local receivers: a new high-priority
// item is posted once to its owner's webhook as Slack-compatible JSON (text
// and one mrkdwn block, Slack markup in task IDs and reasons escaped); a
// receiver that fails first is retried with backoff and the delivery is
// recorded (operator log, task timeline, metric) with its attempts; a
// receiver that never answers is given up after the attempts, each bounded
// by the timeout, and recorded as failed, while the console keeps serving
// and other owners' notices go out; a redirect to another host is not
// followed; an item past its SLA is notified; items of normal priority
// within their SLA are not; of two replicas with the same webhooks only one
// sends each notice; a restarted console does not send again.
func TestWebhooksDeliverRetryAndRecord(t *testing.T) {
	opts, set := testCluster(t) // t-1, t-2, t-3: normal priority, within SLA
	review, _ := set.Name("review")
	flaky := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			http.Error(w, "try later", http.StatusServiceUnavailable)
		}
	})
	release := make(chan struct{})
	hung := newReceiver(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		select { // never answers within the timeout
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	elsewhere := newReceiver(t, func(int, http.ResponseWriter, *http.Request) {})
	redirecting := newReceiver(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, strings.Replace(elsewhere.URL, "127.0.0.1", "localhost", 1)+"/stolen", http.StatusTemporaryRedirect)
	})
	late := newReceiver(t, func(int, http.ResponseWriter, *http.Request) {})

	h := pwHash()
	users := &Users{Users: []User{{Name: "olga", PasswordBcrypt: string(h), Roles: []string{RoleOperator}}}}
	hooks := &Webhooks{Owners: map[string]string{"ai_product": flaky.URL + "/hook", "security": hung.URL + "/T9/secret-hung", "operations": redirecting.URL, "late_owner": late.URL},
		Timeout: 300 * time.Millisecond, Attempts: 3, Backoff: 50 * time.Millisecond, Check: 100 * time.Millisecond}
	// two replicas with the same webhooks: each notice is sent once
	reg, reg2 := prometheus.NewRegistry(), prometheus.NewRegistry()
	cfg := Config{Users: users, Webhooks: hooks, Registerer: reg, PublicURL: "https://console.example.com"}
	base, _ := startConsole(t, opts, set, cfg)
	cfg.Registerer = reg2
	startConsole(t, opts, set, cfg)
	produceReview(t, opts, review, "t-hot<!channel>", "ai_product", "high", time.Hour)
	produceReview(t, opts, review, "t-sec", "security", "high", time.Hour)
	produceReview(t, opts, review, "t-ops", "operations", "high", time.Hour)
	produceReview(t, opts, review, "t-late", "late_owner", "normal", time.Millisecond)

	olga := newClient(t, base)
	olga.login("olga")
	body := waitFor(t, olga, "/operators", func(b string) bool {
		b = html.UnescapeString(b)
		return strings.Contains(b, "webhook of owner ai_product") && strings.Contains(b, "webhook of owner security") &&
			strings.Contains(b, "webhook of owner operations") && strings.Contains(b, "webhook of owner late_owner")
	})
	body = html.UnescapeString(body)
	for _, want := range []string{
		"webhook of owner ai_product (" + strings.TrimPrefix(flaky.URL, "http://") + "): new high-priority item delivered after 2 attempt(s)",
		"webhook of owner security (" + strings.TrimPrefix(hung.URL, "http://") + "): new high-priority item failed after 3 attempt(s)",
		"webhook of owner operations (" + strings.TrimPrefix(redirecting.URL, "http://") + "): new high-priority item failed after 1 attempt(s)",
		"the webhook redirected to another host: refused",
		"webhook of owner late_owner (" + strings.TrimPrefix(late.URL, "http://") + "): item past its SLA delivered after 1 attempt(s)",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the operator log does not say %q", want)
		}
	}
	if strings.Contains(body, "/hook") || strings.Contains(body, "secret-hung") {
		t.Error("the operator log shows a webhook URL's path (its secret)")
	}
	// the console served all along: the hung receiver held only its owner
	if code, _ := olga.do(http.MethodGet, "/review", nil); code != http.StatusOK {
		t.Errorf("GET /review while a receiver hangs: %d", code)
	}
	if len(elsewhere.got()) != 0 {
		t.Errorf("the redirect to another host was followed: %v", elsewhere.got())
	}
	if n := len(hung.got()); n != 3 {
		t.Errorf("the hung receiver got %d attempts, want 3", n)
	}

	got := flaky.got()
	if len(got) != 2 || got[0] != got[1] {
		t.Fatalf("the flaky receiver got %d posts, want the same notice twice: %v", len(got), got)
	}
	var msg struct {
		Text   string `json:"text"`
		Blocks []struct {
			Type string `json:"type"`
			Text struct{ Type, Text string }
		} `json:"blocks"`
	}
	if err := json.Unmarshal([]byte(got[1]), &msg); err != nil {
		t.Fatalf("not JSON: %v: %s", err, got[1])
	}
	if !strings.Contains(msg.Text, "New high-priority review item") || !strings.Contains(msg.Text, "t-hot&lt;!channel&gt;") ||
		strings.Contains(msg.Text, "<!channel>") || !strings.Contains(msg.Text, "over budget &lt;b&gt;&amp;&lt;/b&gt;") ||
		!strings.Contains(msg.Text, "<https://console.example.com/task?id=t-hot%3C%21channel%3E|Open in the console>") {
		t.Errorf("text %q: want the item, its reason and a link, with Slack markup escaped", msg.Text)
	}
	if len(msg.Blocks) != 1 || msg.Blocks[0].Type != "section" || msg.Blocks[0].Text.Type != "mrkdwn" || msg.Blocks[0].Text.Text != msg.Text {
		t.Errorf("blocks %+v, want one mrkdwn section with the text", msg.Blocks)
	}
	if _, tl := olga.do(http.MethodGet, "/task?id=t-sec", nil); !strings.Contains(tl, "failed after 3 attempt(s)") {
		t.Error("t-sec's timeline does not show the failed delivery")
	}
	counter := func(name string) float64 { return counterOf(t, reg, name) + counterOf(t, reg2, name) }
	if d, f := counter("faultrouter_console_webhook_deliveries_total"), counter("faultrouter_console_webhook_attempts_total"); d != 4 || f != 2+3+1+1 {
		t.Errorf("deliveries %v (want 4 outcomes), attempts %v (want 7)", d, f)
	}

	// a third console on the same topics reads the deliveries back and
	// sends nothing again; t-1..t-3 (normal priority, within SLA) never
	base2, _ := startConsole(t, opts, set, Config{Users: users, Webhooks: hooks})
	olga2 := newClient(t, base2)
	olga2.login("olga")
	waitFor(t, olga2, "/operators", func(b string) bool { return strings.Contains(b, "webhook of owner late_owner") })
	time.Sleep(10 * hooks.Check)
	if n, m := len(flaky.got()), len(late.got()); n != 2 || m != 1 {
		t.Errorf("after a restart the receivers got %d and %d posts, want still 2 and 1", n, m)
	}
}
