package integration

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// xffPost posts a form as a person behind the ingress whose address is xff.
func (h *httpPerson) xffPost(path, xff string, form url.Values) (int, string) {
	h.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, h.base+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("X-Forwarded-For", xff)
	resp, err := h.cl.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp.StatusCode, b.String()
}

var hiddenField = regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`)

// Guards the console under a crowd and across replicas, on the real broker,
// two `faultrouter console` processes behind one address (shared secret, a
// console topic of three partitions, the ingress as --trusted-proxies):
//   - 1,000 failed sign-ins from other addresses, from alice's own and from
//     the ingress itself, naming alice, her e-mail and others, do not keep
//     alice out of the browser she signed in with before;
//   - the failed and throttled sign-ins are in the operator log with their
//     addresses (for an operator);
//   - two reviewers claiming one item at once on the two replicas get one
//     holder, the same on both;
//   - one bulk confirmation posted to both replicas at once decides once.
func TestConsoleCrowdAndReplicasOnTheRealBroker(t *testing.T) {
	e := newEnv(t)
	e.vars = append(e.vars, "FAULTROUTER_CONSOLE_SECRET="+strings.Repeat("k", 32))
	e.startRouter("a", t.TempDir())
	cl := kafkaClient(t)
	if _, err := kadm.NewClient(cl).CreateTopic(context.Background(), 3, 1, nil, e.prefix+"faultrouter.console"); err != nil {
		t.Fatal(err)
	}
	hash := e.hashPassword("s3cret-pw")
	users := fmt.Sprintf("users:\n  - {name: alice, email: alice@example.com, password_bcrypt: %q, roles: [reviewer, operator], owners: [\"*\"]}\n"+
		"  - {name: bob, password_bcrypt: %q, roles: [reviewer], owners: [\"*\"]}\n", hash, hash)
	one := e.startConsole(users, "--trusted-proxies", "127.0.0.1")
	two := e.startConsole(users, "--trusted-proxies", "127.0.0.1")

	const home = "203.0.113.7"
	alice := newHTTPPerson(t, one.url)
	if code, body := alice.xffPost("/login", home, url.Values{"csrf": {alice.csrf("/login")}, "name": {"alice"}, "password": {"s3cret-pw"}}); code != http.StatusSeeOther {
		t.Fatalf("alice's first sign-in: %d %s", code, pageError(body))
	}
	alice.post("/logout", url.Values{"csrf": {alice.csrf("/review")}})
	crowd := newHTTPPerson(t, one.url)
	tok := crowd.csrf("/login")
	names := []string{"alice", "alice@example.com", "bob", "root"}
	for i := 0; i < 1000; i++ {
		xff := []string{fmt.Sprintf("198.51.%d.%d", i/250, i%250), fmt.Sprintf("2001:db8:%x::1", i), home, "127.0.0.1"}[i%4]
		if code, _ := crowd.xffPost("/login", xff, url.Values{"csrf": {tok}, "name": {names[i%len(names)]}, "password": {fmt.Sprintf("guess-%d", i)}}); code == http.StatusSeeOther {
			t.Fatalf("guess %d signed in", i)
		}
	}
	if code, body := alice.xffPost("/login", home, url.Values{"csrf": {alice.csrf("/login")}, "name": {"alice"}, "password": {"s3cret-pw"}}); code != http.StatusSeeOther {
		t.Fatalf("alice from her own browser after 1,000 failures by others: %d %q, want 303", code, pageError(body))
	}
	if !waitFor(30*time.Second, func() bool {
		_, b := alice.get("/operators")
		return strings.Contains(b, "login_throttled") && strings.Contains(b, "198.51.") && strings.Contains(b, "2001:db8:")
	}) {
		t.Errorf("the operator log lacks the throttled sign-ins with their addresses")
	}

	// two review items through the router
	e.cli(taskEvent("r-1", "t-rep-1", 1, `"status":"OK","stage":"MODEL","output":{"text":"I cannot help with that.","schema_valid":true,"confidence":0.9}`)+
		taskEvent("r-2", "t-rep-2", 1, `"status":"OK","stage":"MODEL","output":{"text":"I cannot help with that.","schema_valid":true,"confidence":0.9}`),
		"produce", "--topic", "ingress")
	bob := newHTTPPerson(t, two.url)
	bob.login("bob", "s3cret-pw")
	for _, p := range []*httpPerson{alice, bob} {
		if !waitFor(60*time.Second, func() bool {
			_, b := p.get("/review")
			return strings.Contains(b, `data-task="t-rep-1"`) && strings.Contains(b, `data-task="t-rep-2"`)
		}) {
			t.Fatalf("%s's queue never showed both items", p.base)
		}
	}
	ta, tb := alice.csrf("/review"), bob.csrf("/review")
	codes := make(chan int, 2)
	go func() {
		code, _ := alice.post("/review/claim", url.Values{"csrf": {ta}, "task": {"t-rep-1"}, "op": {"claim"}})
		codes <- code
	}()
	go func() {
		code, _ := bob.post("/review/claim", url.Values{"csrf": {tb}, "task": {"t-rep-1"}, "op": {"claim"}})
		codes <- code
	}()
	if c1, c2 := <-codes, <-codes; (c1 == http.StatusSeeOther) == (c2 == http.StatusSeeOther) {
		t.Errorf("two claims of t-rep-1 on two replicas answered %d and %d, want exactly one 303", c1, c2)
	}
	_, pa := alice.get("/review")
	_, pb := bob.get("/review")
	aliceHolds, bobHolds := strings.Contains(queueRowHTML(pa, "t-rep-1"), "claimed by you"), strings.Contains(queueRowHTML(pb, "t-rep-1"), "claimed by you")
	if aliceHolds == bobHolds || (aliceHolds && !strings.Contains(queueRowHTML(pb, "t-rep-1"), "alice")) || (bobHolds && !strings.Contains(queueRowHTML(pa, "t-rep-1"), "bob")) {
		t.Errorf("the replicas disagree on t-rep-1's holder (alice holds: %v, bob holds: %v)", aliceHolds, bobHolds)
	}
	holder := map[bool]*httpPerson{true: alice, false: bob}[aliceHolds]
	holder.post("/review/claim", url.Values{"csrf": {holder.csrf("/review")}, "task": {"t-rep-1"}, "op": {"release"}})

	// one confirmation, posted to both replicas at once by alice's browser
	_, preview := alice.post("/review/bulk", url.Values{"csrf": {alice.csrf("/review")}, "action": {"approve"}, "reason": {"batch fine"}})
	i := strings.Index(preview, `action="/review/bulk"`)
	if i < 0 {
		t.Fatalf("no bulk confirmation form: %s", pageError(preview))
	}
	form := url.Values{"action": {"approve"}}
	for _, m := range hiddenField.FindAllStringSubmatch(preview[i:strings.Index(preview[i:], "</form>")+i], -1) {
		form.Add(m[1], m[2])
	}
	other := newHTTPPerson(t, two.url)
	u1, _ := url.Parse(one.url)
	u2, _ := url.Parse(two.url)
	other.cl.Jar.SetCookies(u2, alice.cl.Jar.Cookies(u1))
	for _, p := range []*httpPerson{alice, other} {
		go func() {
			code, _ := p.post("/review/bulk", form)
			codes <- code
		}()
	}
	if c1, c2 := <-codes, <-codes; (c1 == http.StatusSeeOther) == (c2 == http.StatusSeeOther) {
		t.Errorf("one confirmation posted to two replicas answered %d and %d, want one 303 and one refusal", c1, c2)
	}
	// each item's approval is audited once; a second batch would be audited
	// review.no_open_item
	approvals := func() (n int, audit string) {
		audit = e.cli("", "tail", "--topic", "audit", "--from-beginning", "--until-end", "--format", "json")
		for _, line := range strings.Split(audit, "\n") {
			if strings.Contains(line, "MANUAL_OVERRIDE_SUCCESS") && (strings.Contains(line, "t-rep-1") || strings.Contains(line, "t-rep-2")) {
				n++
			}
		}
		return n, audit
	}
	if !waitFor(60*time.Second, func() bool { n, _ := approvals(); return n >= 2 }) {
		t.Fatalf("the approvals of t-rep-1 and t-rep-2 were never audited")
	}
	time.Sleep(3 * time.Second) // a second batch would be audited by now
	if n, audit := approvals(); n != 2 || strings.Contains(audit, "review.no_open_item") {
		t.Errorf("%d approvals audited for the 2 items (no_open_item: %v): the confirmation acted twice", n, strings.Contains(audit, "review.no_open_item"))
	}
}
