package integration

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Guards the operator console end to end, in a real browser against the real
// broker and router: a reviewer signs in, approves one item (its retry is
// published with the same task ID) and rejects another after seeing the
// end-user message (its audit carries MANUAL_REJECTED and the message);
// an operator resets a latched template breaker (the OPEN->CLOSED transition
// names them) and re-drives a dead letter, dry run first (nothing sent) and
// then for real (re-driven to ingress with lineage, audited by the router).
// Refused: a request without a session, one without a CSRF token, a viewer's
// approval, a second decision on the same item; another reviewer's open page
// shows the decision live. The operator log lists alice's actions. Each page
// is screenshot.
func TestConsoleInTheBrowser(t *testing.T) {
	ctx := browser(t)
	e := newEnv(t)
	e.startRouter("a", t.TempDir())
	hash := e.hashPassword("s3cret-pw")
	users := fmt.Sprintf(`users:
  - {name: alice, password_bcrypt: %q, roles: [reviewer, operator], owners: ["*"]}
  - {name: bob, password_bcrypt: %q, roles: [reviewer], owners: [ai_product, operations]}
  - {name: victor, password_bcrypt: %q, roles: [viewer]}
`, hash, hash, hash)
	c := e.startConsole(users)

	halluc := strings.Replace(taskEvent("h-1", "t-halluc", 1,
		`"status":"OK","stage":"MODEL","output":{"text":"Shipped on 2026-02-30.","schema_valid":true,"confidence":0.95,"flags":["fabricated_data"]}`),
		`"prompt_template":"support-v3"`, `"prompt_template":"ship-v2"`, 1)
	business := taskEvent("rej-1", "t-reject", 1, `"status":"ERROR","stage":"BUSINESS","error":{"type":"BusinessError","http_status":422,"code":"insufficient_balance"}`)
	e.cli(taskEvent("appr-1", "t-approve", 1, refusalFields)+business+halluc, "produce", "--topic", "ingress")
	cl := kafkaClient(t, kgo.DefaultProduceTopic(e.prefix+"ai.tasks.ingress"))
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Key: []byte("t-poison"), Value: []byte("\x00\x01 not avro")}).FirstErr(); err != nil {
		t.Fatal(err)
	}

	// Nothing is served without a session; a page sends the browser to the
	// sign-in.
	anon := newHTTPPerson(t, c.url)
	if code, _ := anon.get("/review"); code != http.StatusSeeOther {
		t.Errorf("GET /review without a session: status %d, want 303 to the sign-in", code)
	}
	if code, body := anon.post("/review/decide", url.Values{"task": {"t-approve"}, "action": {"approve"}, "reason": {"x"}}); code != http.StatusUnauthorized {
		t.Errorf("POST without a session: status %d, want 401: %s", code, pageError(body))
	}

	// alice signs in through the form and sees the queue.
	run(t, ctx, c, "visit the queue", chromedp.Navigate(c.url+"/review"), chromedp.WaitVisible(css("#name")))
	loc, _ := chromedp.Run(ctx, chromedp.Location())
	run(t, ctx, c, "sign in",
		shot(t, "console-login.png"),
		chromedp.SendKeys(css("#name"), "alice"),
		chromedp.SendKeys(css("#password"), "s3cret-pw"),
		chromedp.Click(css("#signin")),
		chromedp.WaitVisible(css("#queue")),
	)
	if !strings.Contains(loc, "/login") {
		t.Errorf("an anonymous visit to /review landed on %s, want the sign-in", loc)
	}
	row := func(task string) string { return `#queue tr[data-task="` + task + `"]` }
	run(t, ctx, c, "queue shows the items",
		textUntil(c.url+"/review", "#queue", "t-halluc"),
		textUntil(c.url+"/review", "#queue", "t-reject"),
		textUntil(c.url+"/review", "#queue", "t-approve"),
		shot(t, "console-review.png"),
	)

	// bob opened the queue too: he will try the item alice decides.
	bob := newHTTPPerson(t, c.url)
	bob.login("bob", "s3cret-pw")
	bobToken := bob.csrf("/review")

	// bob has the queue open in his own browser session while alice decides
	bobTab, closeBob := chromedp.NewContext(ctx, chromedp.WithNewBrowserContext())
	defer closeBob()
	if err := chromedp.Do(bobTab); err != nil { // opens the tab for the life of bobTab, not of one step's deadline
		t.Fatal(err)
	}
	run(t, bobTab, c, "bob signs in",
		chromedp.Navigate(c.url+"/login"),
		chromedp.SendKeys(css("#name"), "bob"),
		chromedp.SendKeys(css("#password"), "s3cret-pw"),
		chromedp.Click(css("#signin")),
		chromedp.WaitVisible(css(row("t-approve")+` button.approve`)),
	)

	run(t, ctx, c, "approve t-approve",
		chromedp.SendKeys(css(row("t-approve")+` input[name=reason]`), "the answer is right"),
		chromedp.Click(css(row("t-approve")+` button.approve`)),
		chromedp.WaitVisible(css("#flash")),
	)
	// bob's page learns of it without a reload: the row is marked decided by
	// alice and its buttons are disabled
	run(t, bobTab, c, "bob sees alice's decision live",
		chromedp.WaitVisible(css(row("t-approve")+`.decided`)),
		chromedp.WaitVisible(css(row("t-approve")+` button.approve[disabled]`)),
	)
	if got := text(t, bobTab, c, row("t-approve")+` .state`); !strings.Contains(got, "alice") {
		t.Errorf("bob's row of t-approve says %q, want it decided by alice", got)
	}
	closeBob()

	run(t, ctx, c, "reject t-reject",
		chromedp.SendKeys(css(row("t-reject")+` input[name=reason]`), "the account is closed"),
		chromedp.Click(css(row("t-reject")+` button.reject`)),
		chromedp.WaitVisible(css("#usermsg")),
		shot(t, "console-reject.png"),
	)
	userMsg := text(t, ctx, c, "#usermsg")
	run(t, ctx, c, "send the rejection", chromedp.Click(css("#send-reject")), chromedp.WaitVisible(css("#flash")))
	for _, want := range []string{"Your submission has a problem: the account is closed.", "您的材料存在the account is closed问题"} {
		if !strings.Contains(userMsg, want) {
			t.Errorf("the reject page shows %q, want it to contain %q", userMsg, want)
		}
	}

	// The second decision on t-approve is refused with a clear message.
	code, body := bob.post("/review/decide", url.Values{"csrf": {bobToken}, "task": {"t-approve"}, "action": {"reject"}, "reason": {"no"}})
	if code != http.StatusConflict || !strings.Contains(pageError(body), "already decided") {
		t.Errorf("bob's second decision on t-approve: status %d %q, want 409 saying it is already decided", code, pageError(body))
	}
	// A viewer may not approve, even with a valid token; a request without
	// the token is refused.
	victor := newHTTPPerson(t, c.url)
	victor.login("victor", "s3cret-pw")
	if _, page := victor.get("/review"); strings.Contains(page, `value="approve"`) {
		t.Errorf("the viewer's queue offers an approve button")
	}
	code, body = victor.post("/review/decide", url.Values{"csrf": {victor.csrf("/review")}, "task": {"t-halluc"}, "action": {"approve"}, "reason": {"x"}})
	if code != http.StatusForbidden || !strings.Contains(pageError(body), "view only") {
		t.Errorf("viewer approves t-halluc: status %d %q, want 403 saying they may view only", code, pageError(body))
	}
	code, body = bob.post("/review/decide", url.Values{"task": {"t-halluc"}, "action": {"approve"}, "reason": {"x"}})
	if code != http.StatusForbidden || !strings.Contains(pageError(body), "CSRF") {
		t.Errorf("a decision without a CSRF token: status %d %q, want 403 naming the CSRF token", code, pageError(body))
	}

	// What the router made of the decisions, read from Kafka.
	retries := e.tailUntil("retry", 60*time.Second, func(r []map[string]any) bool { return len(byTask(r, "t-approve")) >= 1 })
	if got := byTask(retries, "t-approve"); len(got) != 1 || str(got[0], "event_id") != "appr-1" || str(got[0], "decision.rule") != "MANUAL_OVERRIDE_SUCCESS" {
		t.Errorf("retry topic after the approval: %v, want one retry of appr-1 with task ID t-approve", got)
	}
	rejected := func(a []map[string]any) []map[string]any {
		var out []map[string]any
		for _, x := range byTask(a, "t-reject") {
			if str(x, "decision.rule") == "MANUAL_REJECTED" {
				out = append(out, x)
			}
		}
		return out
	}
	audit := e.tailUntil("audit", 60*time.Second, func(a []map[string]any) bool { return len(rejected(a)) >= 1 })
	if rj := rejected(audit); len(rj) != 1 || !strings.Contains(str(rj[0], "decision.user_message"), "the account is closed") ||
		!strings.Contains(str(rj[0], "decision.reason"), "alice") {
		t.Errorf("audit of the reject: %v, want one MANUAL_REJECTED by alice with the user message", rj)
	}
	for _, d := range e.tailNow("decisions") {
		if str(d, "task_id") == "t-halluc" && get(d, "approve") != nil { // a review decision, not the router's breaker latch
			t.Errorf("a refused request reached the decisions topic: %v", d)
		}
	}
	// The items close once the router has audited the decisions.
	run(t, ctx, c, "items close",
		textUntil(c.url+"/review", "#closed", "MANUAL_REJECTED"),
		textUntil(c.url+"/review", "#closed", "MANUAL_OVERRIDE_SUCCESS"),
	)

	// The task timeline tells the approved task's story with the reviewer.
	run(t, ctx, c, "timeline",
		textUntil(c.url+"/task?id=t-approve", "#timeline", "review approve by alice"),
		shot(t, "console-timeline.png"),
	)
	run(t, ctx, c, "unknown task", chromedp.Navigate(c.url+"/task?id=t-nobody"))
	if got := text(t, ctx, c, "#no-records"); got != "No records for this task." {
		t.Errorf("the timeline of an unknown task says %q, want \"No records for this task.\"", got)
	}

	// The hallucination latched the ship-v2 template breaker; alice resets it.
	brk := `#breakers tr[data-breaker="PROMPT_TEMPLATE/ship-v2"]`
	run(t, ctx, c, "reset the latched breaker",
		textUntil(c.url+"/breakers", "#breakers", "latched until a person resets it"),
		shot(t, "console-breakers.png"),
		chromedp.SendKeys(css(brk+` input[name=reason]`), "prompt rolled back"),
		chromedp.Click(css(brk+` button`)),
		chromedp.WaitVisible(css("#flash")),
	)
	closedBy := func(a []map[string]any) bool {
		for _, x := range a {
			if str(x, "key") == "ship-v2" && str(x, "to") == "CLOSED" && strings.Contains(str(x, "reason"), "alice") {
				return true
			}
		}
		return false
	}
	if a := e.tailUntil("alerts", 60*time.Second, closedBy); !closedBy(a) {
		t.Errorf("alerts: no OPEN->CLOSED of ship-v2 naming alice after the reset: %v", a)
	}
	run(t, ctx, c, "breaker shows closed", textUntil(c.url+"/breakers", brk, "CLOSED"))

	// The poison record is a dead letter; alice re-drives it, dry run first.
	redriven := func() []map[string]any {
		out, _ := e.replayJSON("--topic", "ingress")
		var r []map[string]any
		for _, x := range out {
			if get(x, "record.redrive") != nil {
				r = append(r, x)
			}
		}
		return r
	}
	dl := `#deadletters tr[data-id]`
	run(t, ctx, c, "dead letter dry run",
		textUntil(c.url+"/deadletter", "#deadletters", "INVALID_INPUT"),
		shot(t, "console-deadletter.png"),
		chromedp.Click(css(dl+` input[type=checkbox]`)),
		chromedp.SendKeys(css(`#redrive input[name=reason]`), "decoder fixed"),
		chromedp.Click(css("#preview-redrive")),
		chromedp.WaitVisible(css("#preview-count")),
	)
	run(t, ctx, c, "screenshot the preview", shot(t, "console-redrive-preview.png"))
	preview := text(t, ctx, c, "#preview-count")
	if !strings.Contains(preview, "Would re-drive 1 of 1") {
		t.Errorf("dry run says %q, want 1 of 1 to re-drive", preview)
	}
	if r := redriven(); len(r) != 0 {
		t.Fatalf("the dry run sent records to ingress: %v", r)
	}
	run(t, ctx, c, "re-drive for real",
		chromedp.Click(css("#run-redrive")),
		chromedp.WaitVisible(css("#flash")),
		textUntil(c.url+"/deadletter", "#jobs", "done"),
	)
	var got []map[string]any
	waitFor(30*time.Second, func() bool { got = redriven(); return len(got) >= 1 })
	lineage := func(x map[string]any, k string) string {
		s, _ := get(x, "record.redrive").(map[string]any)[k].(string)
		return s
	}
	if len(got) != 1 || lineage(got[0], "count") != "1" || lineage(got[0], "source.topic") != e.prefix+"ai.tasks.deadletter" {
		t.Fatalf("ingress after the re-drive: %v, want one record re-driven from the dead-letter topic, count 1", got)
	}
	jobs := text(t, ctx, c, "#jobs")
	if !strings.Contains(jobs, "alice") || !strings.Contains(jobs, "decoder fixed") || !strings.Contains(jobs, "1 / 1") {
		t.Errorf("the jobs table says %q, want alice, her reason and 1 / 1", jobs)
	}
	// the router audits the re-driven input (it is still not Avro: INVALID_INPUT)
	off := int64(get(got[0], "record.offset").(float64))
	part := int32(get(got[0], "record.partition").(float64))
	if a := e.tailUntil("audit", 60*time.Second, func(a []map[string]any) bool { return len(auditOf(a, e.prefix+"ai.tasks.ingress", part, off)) == 1 }); len(auditOf(a, e.prefix+"ai.tasks.ingress", part, off)) != 1 {
		t.Errorf("the re-driven record has no audit record")
	}

	// The operator log holds what alice did, newest first.
	run(t, ctx, c, "operator log",
		textUntil(c.url+"/operators", "#operator-log", "redrive"),
		shot(t, "console-operators.png"),
	)
	oplog := text(t, ctx, c, "#operator-log")
	for _, want := range []string{"login", "approve", "reject", "breaker_reset", "redrive", "decoder fixed"} {
		if !strings.Contains(oplog, want) {
			t.Errorf("the operator log lacks %q: %s", want, oplog)
		}
	}

	// The alerts feed, and the pages in Chinese for a browser that asks.
	run(t, ctx, c, "alerts",
		textUntil(c.url+"/alerts", "#alerts", "ship-v2"),
		shot(t, "console-alerts.png"),
		chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
			_, err := chromedp.Call(ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: network.Headers{"Accept-Language": "zh-CN,zh;q=0.9"}})
			return err
		}),
		textUntil(c.url+"/review", "h1", "审核队列"),
		shot(t, "console-review-zh.png"),
	)
}
