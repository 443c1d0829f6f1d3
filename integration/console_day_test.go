package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
)

// Guards a reviewer's day in a real browser against the real broker and
// router: the queue shows its keyboard hints; j/k move the selection; c
// claims the selected item, and another reviewer's page shows who holds it
// while the server refuses that reviewer's decision and claim; a, the
// reason and Enter ask to confirm, and a second Enter approves the selected
// item; the queue comes back with the next item selected; r, the reason and Enter show the end-user message,
// and Enter sends the rejection; a keyboard decision with a wrong CSRF token
// is refused (nothing decided); the progress table counts the day's
// decisions; an operator assigns an item; the owner's webhook (a local
// receiver) gets the new high-priority item as Slack-compatible JSON; the
// operator log lists the claim, the decisions, the assignment and the
// webhook delivery. The claim, the keyboard hints and the operator log are
// screenshot.
func TestConsoleReviewersDayInTheBrowser(t *testing.T) {
	ctx := browser(t)
	e := newEnv(t)
	e.startRouter("a", t.TempDir())

	var mu sync.Mutex
	var hooks []string
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		hooks = append(hooks, string(b))
		mu.Unlock()
	}))
	defer receiver.Close()
	hookFile := filepath.Join(t.TempDir(), "webhooks.yaml")
	if err := os.WriteFile(hookFile, []byte(fmt.Sprintf("owners: {security: %q}\ncheck: 500ms\n", receiver.URL+"/hooks/T1")), 0o600); err != nil {
		t.Fatal(err)
	}

	hash := e.hashPassword("s3cret-pw")
	users := fmt.Sprintf(`users:
  - {name: alice, password_bcrypt: %q, roles: [reviewer], owners: ["*"]}
  - {name: bob, password_bcrypt: %q, roles: [reviewer], owners: ["*"]}
  - {name: olga, password_bcrypt: %q, roles: [operator]}
`, hash, hash, hash)
	c := e.startConsole(users, "--claim-ttl", "20m", "--webhooks", hookFile)
	e.cli(taskEvent("k1", "t-k1", 1, refusalFields)+taskEvent("k2", "t-k2", 1, refusalFields)+taskEvent("k3", "t-k3", 1, refusalFields)+
		taskEvent("auth-1", "t-auth", 1, stateAuth)+taskEvent("auth-2", "t-auth", 2, stateAuth), "produce", "--topic", "ingress")

	signIn := func(tab context.Context, name string) {
		run(t, tab, c, name+" signs in",
			chromedp.Navigate(c.url+"/login"),
			chromedp.SendKeys(css("#name"), name),
			chromedp.SendKeys(css("#password"), "s3cret-pw"),
			chromedp.Click(css("#signin")),
			chromedp.WaitVisible(css("#queue")),
		)
	}
	eval := func(tab context.Context, js string) string {
		t.Helper()
		tctx, cancel := context.WithTimeout(tab, 30*time.Second)
		defer cancel()
		s, err := chromedp.Run(tctx, chromedp.Evaluate[string](js))
		if err != nil {
			t.Fatalf("%s: %v\nconsole logs:\n%s", js, err, c.logs.String())
		}
		return s
	}
	current := func(tab context.Context) string {
		return eval(tab, `(document.querySelector("#queue tr.current") || {dataset: {}}).dataset.task || ""`)
	}
	// selectTask presses j from the top until task is selected
	selectTask := func(tab context.Context, task string) {
		t.Helper()
		for i := 0; i < 10 && current(tab) != task; i++ {
			run(t, tab, c, "press j", chromedp.KeyEvent("j"))
		}
		if got := current(tab); got != task {
			t.Fatalf("j never selected %s; selected %q", task, got)
		}
	}
	row := func(task string) string { return `#queue tr[data-task="` + task + `"]` }

	signIn(ctx, "alice")
	run(t, ctx, c, "the queue shows the items",
		textUntil(c.url+"/review", "#queue", "t-auth"),
		textUntil(c.url+"/review", "#queue", "t-k3"),
		textUntil(c.url+"/review", "#queue", "t-k1"),
	)
	if hints := text(t, ctx, c, "#keys"); !strings.Contains(hints, "next / previous item") || !strings.Contains(hints, "claim") || !strings.Contains(hints, "approve") {
		t.Errorf("the keyboard hints say %q", hints)
	}
	order := strings.Split(eval(ctx, `Array.from(document.querySelectorAll("#queue tbody tr[data-task]")).map(r => r.dataset.task).join(",")`), ",")
	if len(order) < 4 || current(ctx) != order[0] {
		t.Fatalf("rows %v, selected %q: want the first row selected", order, current(ctx))
	}
	run(t, ctx, c, "j then j then k", chromedp.KeyEvent("j"), chromedp.KeyEvent("j"), chromedp.KeyEvent("k"))
	if got := current(ctx); got != order[1] {
		t.Errorf("after j j k the selection is %q, want the second row %s", got, order[1])
	}

	// c claims t-k1
	selectTask(ctx, "t-k1")
	run(t, ctx, c, "c claims t-k1", chromedp.KeyEvent("c"), flashSays("You hold t-k1 now"))
	if got := text(t, ctx, c, row("t-k1")+" .holder"); !strings.Contains(got, "claimed by you") {
		t.Errorf("t-k1 after alice's claim says %q", got)
	}
	if got := current(ctx); got != "t-k1" {
		t.Errorf("after the claim the selection is %q, want t-k1", got)
	}

	// bob sees who holds it; his keyboard approval is refused on the page,
	// and the server refuses his decision and his claim
	bobTab, closeBob := chromedp.NewContext(ctx, chromedp.WithNewBrowserContext())
	defer closeBob()
	if err := chromedp.Do(bobTab); err != nil {
		t.Fatal(err)
	}
	signIn(bobTab, "bob")
	run(t, bobTab, c, "bob sees alice's claim", textUntil(c.url+"/review", row("t-k1")+" .holder", "held by alice"))
	selectTask(bobTab, "t-k1")
	run(t, bobTab, c, "bob presses a on t-k1", chromedp.KeyEvent("a"), shot(t, "console-claim.png"))
	if got := text(t, bobTab, c, "#keys-msg"); !strings.Contains(got, "You may not decide t-k1") || !strings.Contains(got, "held by alice") {
		t.Errorf("bob's a on t-k1 says %q, want that alice holds it", got)
	}
	closeBob()
	bob := newHTTPPerson(t, c.url)
	bob.login("bob", "s3cret-pw")
	tok := bob.csrf("/review")
	for _, try := range []struct {
		path string
		form url.Values
	}{
		{"/review/decide", url.Values{"task": {"t-k1"}, "action": {"approve"}, "reason": {"mine now"}}},
		{"/review/claim", url.Values{"task": {"t-k1"}, "op": {"claim"}}},
	} {
		try.form.Set("csrf", tok)
		if code, body := bob.post(try.path, try.form); code != http.StatusConflict || !strings.Contains(pageError(body), "alice holds task t-k1") {
			t.Errorf("bob's %s of t-k1 held by alice: %d %q, want 409 naming alice", try.path, code, pageError(body))
		}
	}

	// a, the reason, Enter: approved, and the next item is selected
	run(t, ctx, c, "a starts the approval", chromedp.KeyEvent("a"))
	if got := eval(ctx, `document.activeElement.name + "@" + document.activeElement.closest("tr").dataset.task`); got != "reason@t-k1" {
		t.Errorf("after a the focus is on %q, want t-k1's reason", got)
	}
	run(t, ctx, c, "type the reason, Enter", chromedp.KeyEvent("the answer is right"), chromedp.KeyEvent(kb.Enter), shot(t, "console-keyboard.png"))
	if got := text(t, ctx, c, "#keys-msg"); !strings.Contains(got, "Press Enter again to approve t-k1") {
		t.Errorf("after the first Enter the page says %q, want it to ask for a second", got)
	}
	if _, page := bob.get("/review"); !strings.Contains(queueRowHTML(page, "t-k1"), "<b>alice</b>") || strings.Contains(queueRowHTML(page, "t-k1"), "decided") {
		t.Error("t-k1 is decided after one Enter: an approval must be confirmed")
	}
	run(t, ctx, c, "Enter again approves", chromedp.KeyEvent(kb.Enter), flashSays("Approval of t-k1 sent"))
	if got := text(t, ctx, c, "#flash"); !strings.Contains(got, "Approval of t-k1 sent") {
		t.Errorf("after Enter the page says %q", got)
	}
	if got := current(ctx); got != "t-k2" {
		t.Errorf("after the approval the selection is %q, want the next item t-k2", got)
	}

	// r, the reason, Enter: the end-user message; Enter sends
	run(t, ctx, c, "r, reason, Enter", chromedp.KeyEvent("r"), chromedp.KeyEvent("not what was asked"), chromedp.KeyEvent(kb.Enter),
		chromedp.WaitVisible(css("#usermsg")))
	if got := eval(ctx, `document.querySelector("form input[name=reason]").value`); got != "not what was asked" {
		t.Errorf("the rejection's reason is %q, want exactly what was typed after r", got)
	}
	run(t, ctx, c, "Enter sends the rejection", chromedp.KeyEvent(kb.Enter), flashSays("Rejection of t-k2 sent"))
	if got := text(t, ctx, c, "#flash"); !strings.Contains(got, "Rejection of t-k2 sent") {
		t.Errorf("after the confirmation the page says %q", got)
	}

	// the keyboard goes through the forms: a wrong CSRF token is refused
	selectTask(ctx, "t-k3")
	eval(ctx, `document.querySelector('`+row("t-k3")+` form.decision input[name=csrf]').value = "00"; ""`)
	run(t, ctx, c, "a with a wrong token", chromedp.KeyEvent("a"), chromedp.KeyEvent("forged"), chromedp.KeyEvent(kb.Enter), chromedp.KeyEvent(kb.Enter),
		chromedp.WaitVisible(css("#error")))
	if got := text(t, ctx, c, "#error"); !strings.Contains(got, "CSRF") {
		t.Errorf("a keyboard approval with a wrong token says %q, want a CSRF refusal", got)
	}

	// progress: alice decided two items today
	run(t, ctx, c, "progress counts alice's decisions",
		textUntil(c.url+"/review", `#reviewer-progress tr[data-reviewer="alice"] .decided-today`, "2"))
	if _, page := bob.get("/review"); !strings.Contains(queueRowHTML(page, "t-k3"), `value="approve"`) {
		t.Error("t-k3 is no longer open to decide after the refused keyboard approval")
	}

	// olga assigns t-k3 to bob
	olga := newHTTPPerson(t, c.url)
	olga.login("olga", "s3cret-pw")
	if code, body := olga.post("/review/assign", url.Values{"csrf": {olga.csrf("/review")}, "task": {"t-k3"}, "to": {"bob"}}); code != http.StatusSeeOther {
		t.Errorf("olga assigns t-k3 to bob: %d %s", code, pageError(body))
	}

	// the security owner's webhook got the high-priority t-auth
	if !waitFor(60*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, h := range hooks {
			if strings.Contains(h, "New high-priority review item") && strings.Contains(h, "t-auth") && strings.Contains(h, `"blocks"`) {
				return true
			}
		}
		return false
	}) {
		t.Errorf("the security webhook never got t-auth; got %v\nconsole logs:\n%s", hooks, c.logs.String())
	}

	run(t, ctx, c, "the operator log",
		textUntil(c.url+"/operators", "#operator-log", "webhook of owner security"),
		textUntil(c.url+"/operators", "#operator-log", "assigned task t-k3 to bob"),
		shot(t, "console-operator-log.png"))
	log := text(t, ctx, c, "#operator-log")
	// the keys a and r typed nothing into the reasons
	reasons := eval(ctx, `Array.from(document.querySelectorAll("#operator-log td.reason")).map(td => td.textContent).join("|")`)
	for _, want := range []string{"|the answer is right|", "|not what was asked|"} {
		if !strings.Contains("|"+reasons+"|", want) {
			t.Errorf("the operator log's reasons %q lack %q", reasons, strings.Trim(want, "|"))
		}
	}
	for _, want := range []string{"claimed task t-k1", "the answer is right", "not what was asked", "assigned task t-k3 to bob",
		"new high-priority item delivered after 1 attempt(s)"} {
		if !strings.Contains(log, want) {
			t.Errorf("the operator log does not show %q", want)
		}
	}
	if strings.Contains(log, "/hooks/T1") {
		t.Error("the operator log shows the webhook URL's path")
	}
}

// queueRowHTML is the HTML of task's row in a queue page.
func queueRowHTML(page, task string) string {
	i := strings.Index(page, `<tr data-task="`+task+`"`)
	if i < 0 {
		return ""
	}
	page = page[i:]
	if j := strings.Index(page, "</tr>"); j >= 0 {
		page = page[:j]
	}
	return page
}
