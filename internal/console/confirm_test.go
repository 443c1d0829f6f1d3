package console

import (
	"context"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

var hiddenRe = regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`)

// confirmation is the form of a preview page's confirm button, as the
// browser would post it (form is the action/button's own fields).
func confirmation(t *testing.T, body, action string, button url.Values) url.Values {
	t.Helper()
	i := strings.Index(body, `action="`+action+`"`)
	if i < 0 {
		t.Fatalf("no form posting to %s in:\n%s", action, body)
	}
	form := body[i:]
	form = form[:strings.Index(form, "</form>")]
	v := url.Values{}
	for _, m := range hiddenRe.FindAllStringSubmatch(form, -1) {
		v.Add(m[1], html.UnescapeString(m[2]))
	}
	for k, vs := range button {
		v[k] = vs
	}
	return v
}

// Guards the bulk decision's confirmation: it decides exactly the items its
// preview showed, not an item of the same filter that arrived in between;
// the same confirmation submitted twice is refused; and a confirmation whose
// list of items was altered is refused.
func TestBulkConfirmDecidesThePreviewedItemsOnce(t *testing.T) {
	base, opts, set := testConsole(t, Config{Users: testUsers(t)})
	alice := newClient(t, base)
	alice.login("alice")
	waitQueue(t, alice, "t-1", "t-3")
	code, body := alice.do(http.MethodPost, "/review/bulk", url.Values{"csrf": {alice.token("/review")}, "owner": {"ai_product"}, "action": {"approve"}, "reason": {"batch fixed"}})
	if code != http.StatusOK || !strings.Contains(body, "t-1") || !strings.Contains(body, "t-3") {
		t.Fatalf("preview: %d; body:\n%s", code, body)
	}
	confirm := confirmation(t, body, "/review/bulk", url.Values{"action": {"approve"}})

	// t-4 of the same owner arrives after the preview
	produceItem(t, opts, set, "t-4", "ai_product")
	waitQueue(t, alice, "t-4")

	altered := url.Values{}
	for k, v := range confirm {
		altered[k] = v
	}
	altered.Add("task", "t-4")
	if code, body := alice.do(http.MethodPost, "/review/bulk", altered); code != http.StatusBadRequest || !strings.Contains(body, "does not match") {
		t.Errorf("a confirmation with t-4 added: %d, want 400 (does not match the preview): %s", code, pageError(body))
	}
	if code, body := alice.do(http.MethodPost, "/review/bulk", confirm); code != http.StatusSeeOther {
		t.Fatalf("confirm: %d, want 303: %s", code, pageError(body))
	}
	if code, body := alice.do(http.MethodPost, "/review/bulk", confirm); code != http.StatusConflict || !strings.Contains(body, "already") {
		t.Errorf("the same confirmation again: %d, want 409 (already submitted): %s", code, pageError(body))
	}
	decisions, _ := set.Name("decisions")
	c, _ := codec.New()
	got := map[string]bool{}
	for _, r := range readAll(t, opts, decisions) {
		if d, err := c.DecodeReviewDecision(r.Value); err == nil {
			got[d.TaskID] = true
		}
	}
	if len(got) != 2 || !got["t-1"] || !got["t-3"] {
		t.Errorf("decided %v, want exactly the previewed t-1 and t-3", got)
	}
}

// Guards the re-drive's confirmation: a filter re-drive runs exactly the
// records its preview counted, not one that arrived in between; the same
// confirmation twice is refused; a rate above the ceiling is refused.
func TestRedriveConfirmRunsThePreviewedSetOnce(t *testing.T) {
	h := pwHash()
	users := &Users{Users: []User{{Name: "olga", PasswordBcrypt: string(h), Roles: []string{RoleOperator}}}}
	base, opts, set := testConsole(t, Config{Users: users, RedriveRate: 100, MaxRedriveRate: 200})
	dl, _ := set.Name("deadletter")
	ingress, _ := set.Name("ingress")
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	poison := func(key string) *kgo.Record {
		return &kgo.Record{Topic: dl, Key: []byte(key), Value: []byte("raw-" + key), Headers: []kgo.RecordHeader{
			{Key: codec.HeaderErrorStage, Value: []byte(codec.StageDecode)}, {Key: codec.HeaderErrorKind, Value: []byte("k")}}}
	}
	if err := cl.ProduceSync(context.Background(), poison("t-a"), poison("t-b")).FirstErr(); err != nil {
		t.Fatal(err)
	}
	olga := newClient(t, base)
	olga.login("olga")
	waitFor(t, olga, "/deadletter", func(b string) bool { return strings.Count(b, "data-id=") == 2 })
	form := url.Values{"csrf": {olga.token("/deadletter")}, "select": {"filter"}, "reason": {"decoder fixed"}}
	code, body := olga.do(http.MethodPost, "/deadletter/redrive", form)
	if code != http.StatusOK || !strings.Contains(body, "Would re-drive <b>2</b>") {
		t.Fatalf("preview: %d; body:\n%s", code, body)
	}
	confirm := confirmation(t, body, "/deadletter/redrive", url.Values{"run": {"1"}})

	time.Sleep(5 * time.Millisecond) // t-c's time is after the preview's
	if err := cl.ProduceSync(context.Background(), poison("t-c")).FirstErr(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, olga, "/deadletter", func(b string) bool { return strings.Count(b, "data-id=") == 3 })

	fast := url.Values{}
	for k, v := range form {
		fast[k] = v
	}
	fast.Set("rate", "100000")
	if code, body := olga.do(http.MethodPost, "/deadletter/redrive", fast); code != http.StatusBadRequest || !strings.Contains(body, "200") {
		t.Errorf("a rate of 100000/s: %d, want 400 naming the ceiling 200: %s", code, pageError(body))
	}
	if code, body := olga.do(http.MethodPost, "/deadletter/redrive", confirm); code != http.StatusSeeOther {
		t.Fatalf("run: %d: %s", code, pageError(body))
	}
	if code, body := olga.do(http.MethodPost, "/deadletter/redrive", confirm); code != http.StatusConflict || !strings.Contains(body, "already") {
		t.Errorf("the same confirmation again: %d, want 409 (already submitted): %s", code, pageError(body))
	}
	waitFor(t, olga, "/deadletter", func(b string) bool { return strings.Contains(b, `job-state">done`) })
	keys := map[string]bool{}
	for _, r := range readAll(t, opts, ingress) {
		keys[string(r.Key)] = true
	}
	if len(keys) != 2 || !keys["t-a"] || !keys["t-b"] {
		t.Errorf("re-driven %v, want exactly the previewed t-a and t-b", keys)
	}
}

func produceItem(t *testing.T, opts []kgo.Opt, set interface {
	Name(topicspec.Short) (string, error)
}, task, owner string) {
	t.Helper()
	review, _ := set.Name("review")
	produceDecision(t, opts, review, task, event.Decision{Class: event.ClassModelRefusal, Route: event.RouteReview, Rule: "test", Reason: "refused",
		Review: &event.Review{Owner: owner, SLAMs: 60_000}})
}

func waitQueue(t *testing.T, c *client, tasks ...string) {
	t.Helper()
	waitFor(t, c, "/review", func(b string) bool {
		for _, task := range tasks {
			if !strings.Contains(b, `data-task="`+task+`"`) {
				return false
			}
		}
		return true
	})
}

func waitFor(t *testing.T, c *client, path string, ok func(string) bool) string {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, body := c.do(http.MethodGet, path, nil)
		if ok(body) {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never showed what was awaited; body:\n%s", path, body)
		}
		time.Sleep(30 * time.Millisecond)
	}
}
