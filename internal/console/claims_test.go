package console

import (
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

func claimUsers(t *testing.T) *Users {
	h := pwHash()
	u := &Users{Users: []User{
		{Name: "alice", PasswordBcrypt: string(h), Roles: []string{RoleReviewer}, Owners: []string{"ai_product"}},
		{Name: "bob", PasswordBcrypt: string(h), Roles: []string{RoleReviewer}, Owners: []string{"ai_product"}},
		{Name: "sam", PasswordBcrypt: string(h), Roles: []string{RoleReviewer}, Owners: []string{"security"}},
		{Name: "olga", PasswordBcrypt: string(h), Roles: []string{RoleOperator}},
		{Name: "victor", PasswordBcrypt: string(h), Roles: []string{RoleViewer}},
	}}
	if err := u.Validate(); err != nil {
		t.Fatal(err)
	}
	return u
}

// rowOf returns the HTML of the queue row of task, "" when absent.
func queueRow(body, task string) string {
	i := strings.Index(body, `<tr data-task="`+task+`"`)
	if i < 0 {
		return ""
	}
	row := body[i:]
	if j := strings.Index(row, "</tr>"); j >= 0 {
		row = row[:j]
	}
	return row
}

var tagRe = regexp.MustCompile(`<[^>]*>`)

// Guards claims: a reviewer claims an item and every replica (through the
// console topic) shows who holds it; while the claim holds, another
// reviewer's claim, decision and release are refused with the holder's
// name (a bulk decision skips the item), a viewer (role) and a reviewer of another owner are refused; two
// reviewers who claim the same item at once on two replicas get one claim
// and one refusal, and both replicas agree on the holder; an operator
// assigns an item over a claim to a reviewer of its owner (and not to
// anyone else); a claim ends by itself after ClaimTTL and the item is free
// again; each reviewer's progress shows decisions taken today and open
// claims.
func TestClaimsAreSharedAndExpire(t *testing.T) {
	opts, set := testCluster(t)
	cfg := Config{Users: claimUsers(t), Secret: []byte(strings.Repeat("s", 32)), ClaimTTL: 8 * time.Second}
	one, _ := startConsole(t, opts, set, cfg)
	two, _ := startConsole(t, opts, set, cfg)
	login := func(base, name string) *client {
		c := newClient(t, base)
		c.login(name)
		return c
	}
	alice, bob, sam, olga, victor := login(one, "alice"), login(two, "bob"), login(two, "sam"), login(one, "olga"), login(two, "victor")
	waitQueue(t, alice, "t-1", "t-3")
	waitQueue(t, bob, "t-1", "t-3")
	post := func(c *client, path string, form url.Values) (int, string) {
		form.Set("csrf", c.token("/review"))
		code, body := c.do(http.MethodPost, path, form)
		return code, tagRe.ReplaceAllString(pageError(body), "")
	}

	if code, msg := post(alice, "/review/claim", url.Values{"task": {"t-1"}, "op": {"claim"}}); code != http.StatusSeeOther {
		t.Fatalf("alice's claim of t-1: %d %s", code, msg)
	}
	if _, body := alice.do(http.MethodGet, "/review", nil); !strings.Contains(queueRow(body, "t-1"), "claimed by you") {
		t.Errorf("alice's queue does not show t-1 claimed by her:\n%s", queueRow(body, "t-1"))
	}
	// the other replica shows the holder
	body := waitFor(t, bob, "/review", func(b string) bool { return strings.Contains(queueRow(b, "t-1"), "<b>alice</b>") })
	if row := queueRow(body, "t-1"); strings.Contains(row, `value="approve"`) || strings.Contains(row, `value="claim"`) {
		t.Errorf("bob's queue offers to decide or claim t-1 held by alice:\n%s", row)
	}

	refusals := []struct {
		name   string
		who    *client
		path   string
		form   url.Values
		status int
		msg    string
	}{
		{"bob claims an item alice holds", bob, "/review/claim", url.Values{"task": {"t-1"}, "op": {"claim"}}, http.StatusConflict, "alice holds task t-1"},
		{"bob decides an item alice holds", bob, "/review/decide", url.Values{"task": {"t-1"}, "action": {"approve"}, "reason": {"ok"}}, http.StatusConflict, "alice holds task t-1"},
		{"bob rejects an item alice holds", bob, "/review/decide", url.Values{"task": {"t-1"}, "action": {"reject"}, "reason": {"no"}}, http.StatusConflict, "alice holds task t-1"},
		{"bob releases alice's claim", bob, "/review/claim", url.Values{"task": {"t-1"}, "op": {"release"}}, http.StatusForbidden, "only the holder or an operator"},
		{"a viewer claims", victor, "/review/claim", url.Values{"task": {"t-3"}, "op": {"claim"}}, http.StatusForbidden, "reviewer role"},
		{"a reviewer of another owner claims", sam, "/review/claim", url.Values{"task": {"t-3"}, "op": {"claim"}}, http.StatusForbidden, "belongs to owner ai_product"},
		{"a reviewer assigns", alice, "/review/assign", url.Values{"task": {"t-3"}, "to": {"alice"}}, http.StatusForbidden, "operator role"},
		{"an operator assigns to a reviewer of another owner", olga, "/review/assign", url.Values{"task": {"t-3"}, "to": {"sam"}}, http.StatusBadRequest, "sam may not decide task t-3"},
		{"an operator assigns to someone unknown", olga, "/review/assign", url.Values{"task": {"t-3"}, "to": {"mallory"}}, http.StatusBadRequest, "not in the users file"},
		{"a claim of an unknown task", alice, "/review/claim", url.Values{"task": {"t-nope"}, "op": {"claim"}}, http.StatusNotFound, "Unknown task"},
	}
	for _, c := range refusals {
		if code, msg := post(c.who, c.path, c.form); code != c.status || !strings.Contains(msg, c.msg) {
			t.Errorf("%s: %d %q, want %d saying %q", c.name, code, msg, c.status, c.msg)
		}
	}

	// bob's bulk decision over ai_product skips t-1, held by alice
	if code, body := bob.do(http.MethodPost, "/review/bulk", url.Values{"csrf": {bob.token("/review")}, "owner": {"ai_product"},
		"action": {"approve"}, "reason": {"all fine"}}); code != http.StatusOK || !strings.Contains(body, `name="task" value="t-3"`) ||
		strings.Contains(body, `name="task" value="t-1"`) || !strings.Contains(body, "1 skipped") {
		t.Errorf("bob's bulk preview while alice holds t-1: %d, want t-3 only and 1 skipped:\n%s", code, pageError(body))
	}

	// alice and bob claim t-3 at once on two replicas: the topic decides
	var wg sync.WaitGroup
	codes := map[string]int{}
	var mu sync.Mutex
	for name, c := range map[string]*client{"alice": alice, "bob": bob} {
		form := url.Values{"task": {"t-3"}, "op": {"claim"}, "csrf": {c.token("/review")}}
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, _ := c.do(http.MethodPost, "/review/claim", form)
			mu.Lock()
			codes[name] = code
			mu.Unlock()
		}()
	}
	wg.Wait()
	winner := "alice"
	if codes["bob"] == http.StatusSeeOther {
		winner = "bob"
	}
	if (codes["alice"] == http.StatusSeeOther) == (codes["bob"] == http.StatusSeeOther) || codes["alice"]+codes["bob"] != http.StatusSeeOther+http.StatusConflict {
		t.Fatalf("simultaneous claims of t-3: alice %d, bob %d; want one 303 and one 409", codes["alice"], codes["bob"])
	}
	for name, c := range map[string]*client{"victor on two": victor, "olga on one": olga} {
		if _, body := c.do(http.MethodGet, "/review", nil); !strings.Contains(queueRow(body, "t-3"), "<b>"+winner+"</b>") {
			t.Errorf("%s does not see t-3 held by %s:\n%s", name, winner, queueRow(body, "t-3"))
		}
	}

	// olga is offered the reviewers of the item's owner only
	if _, body := olga.do(http.MethodGet, "/review", nil); !strings.Contains(queueRow(body, "t-1"), "<option>alice</option><option>bob</option></select>") {
		t.Errorf("olga's assign choices for t-1 (ai_product) are not alice and bob only:\n%s", queueRow(body, "t-1"))
	}
	// olga assigns t-1 (claimed by alice) to bob: bob may decide, alice not
	if code, msg := post(olga, "/review/assign", url.Values{"task": {"t-1"}, "to": {"bob"}}); code != http.StatusSeeOther {
		t.Fatalf("olga assigns t-1 to bob: %d %s", code, msg)
	}
	waitFor(t, bob, "/review", func(b string) bool { return strings.Contains(queueRow(b, "t-1"), "claimed by you") })
	if code, msg := post(alice, "/review/decide", url.Values{"task": {"t-1"}, "action": {"approve"}, "reason": {"ok"}}); code != http.StatusConflict || !strings.Contains(msg, "bob holds task t-1") || !strings.Contains(msg, "assigned by olga") {
		t.Errorf("alice decides t-1 assigned to bob: %d %q, want 409 naming bob and olga", code, msg)
	}
	if code, msg := post(bob, "/review/decide", url.Values{"task": {"t-1"}, "action": {"approve"}, "reason": {"checked"}}); code != http.StatusSeeOther {
		t.Errorf("bob decides t-1 assigned to him: %d %s", code, msg)
	}

	// the claim on t-3 ends by itself: the loser may then claim it
	loser := map[string]*client{"alice": bob, "bob": alice}[winner]
	freed := false
	for deadline := time.Now().Add(30 * time.Second); !freed && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		code, _ := post(loser, "/review/claim", url.Values{"task": {"t-3"}, "op": {"claim"}})
		freed = code == http.StatusSeeOther
	}
	if !freed {
		t.Errorf("the claim of t-3 by %s never ended", winner)
	}

	// progress: bob decided one item today; the loser holds t-3 now
	body = waitFor(t, olga, "/review", func(b string) bool {
		return strings.Contains(b, `<tr data-reviewer="bob"><td>bob</td><td class="decided-today">1</td>`)
	})
	loserName := map[string]string{"alice": "bob", "bob": "alice"}[winner]
	if !regexp.MustCompile(`data-reviewer="` + loserName + `"[^\n]*class="open-claims">1<`).MatchString(body) {
		t.Errorf("the progress table does not show %s with one open claim:\n%s", loserName, body[strings.Index(body, `id="reviewer-progress"`):][:600])
	}
}
