package integration

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// pwn is script that, should the page ever run it, marks the window.
const pwn = `window.__pwned=1`

// Guards the console against hostile data from Kafka, in a real browser:
// a task ID, a reason, an owner, model output, an input URL, a dead
// letter's key, bytes and error message, each carrying <script>, an event
// handler or a javascript: URL, and strings near 1 MB, are shown as text on
// every page (queue, timeline, dead letter, operator log, alerts): no script
// runs and no element is made from the data.
func TestConsoleRendersHostileDataInert(t *testing.T) {
	ctx := browser(t)
	e := newEnv(t)
	e.startRouter("a", t.TempDir())
	hash := e.hashPassword("s3cret-pw")
	c := e.startConsole(fmt.Sprintf("users:\n  - {name: alice, password_bcrypt: %q, roles: [reviewer, operator], owners: [\"*\"]}\n", hash))

	hostileTask := `t-<script>` + pwn + `</script>`
	script := `<script>` + pwn + `</script><img src=x onerror="` + pwn + `">`
	big := strings.Repeat(script, 800<<10/len(script))

	// through the router: model output with script, an input "URL" that is
	// javascript:, and a second event whose output is near 1 MB
	refusal := fmt.Sprintf(`"status":"OK","stage":"MODEL","output":{"text":%q,"schema_valid":true,"confidence":0.9},"input_ref":{"uri":"javascript:%s"}`,
		"I cannot help with that. "+script, pwn)
	e.cli(taskEvent("h-1", "t-hostile-out", 1, refusal)+taskEvent("h-2", "t-hostile-big", 1,
		fmt.Sprintf(`"status":"OK","stage":"MODEL","output":{"text":%q,"schema_valid":true,"confidence":0.9}`, big)), "produce", "--topic", "ingress")

	// straight onto the topics the console reads: a review item whose task
	// ID, reason, owner and input URL are hostile, and a dead letter whose
	// key, bytes and error message are
	cd, _ := codec.New()
	item, err := cd.EncodeRouted(nil, &event.Routed{
		Event: &event.TaskEvent{EventID: "h-3", TaskID: hostileTask, Attempt: 1, OccurredAt: event.At(time.Now()), Source: script, Action: "refund",
			Status: event.StatusError, InputRef: &event.InputRef{URI: `https://x.example/" onmouseover="` + pwn}},
		Decision: event.Decision{Class: event.ClassModelRefusal, Route: event.RouteReview, Rule: script, Reason: script + big[:100<<10],
			Review: &event.Review{Owner: "o" + script, SLAMs: 60_000}, DecidedAt: event.At(time.Now())}})
	if err != nil {
		t.Fatal(err)
	}
	cl := kafkaClient(t)
	if err := cl.ProduceSync(context.Background(),
		&kgo.Record{Topic: e.prefix + "ai.tasks.review", Key: []byte(hostileTask), Value: item},
		&kgo.Record{Topic: e.prefix + "ai.tasks.deadletter", Key: []byte(hostileTask), Value: []byte(big), Headers: []kgo.RecordHeader{
			{Key: codec.HeaderErrorStage, Value: []byte(codec.StageDecode)}, {Key: codec.HeaderErrorKind, Value: []byte(script)},
			{Key: codec.HeaderErrorMessage, Value: []byte(script)}}},
	).FirstErr(); err != nil {
		t.Fatal(err)
	}

	run(t, ctx, c, "sign in",
		chromedp.Navigate(c.url+"/login"),
		chromedp.SendKeys(css("#name"), "alice"),
		chromedp.SendKeys(css("#password"), "s3cret-pw"),
		chromedp.Click(css("#signin")),
		chromedp.WaitVisible(css("#queue")),
	)
	inert := func(page string) {
		t.Helper()
		got, err := chromedp.Run(ctx, chromedp.Evaluate[string](`String(window.__pwned)`))
		if err != nil {
			t.Fatalf("%s: %v", page, err)
		}
		if got != "undefined" {
			t.Errorf("%s ran script from the data (window.__pwned = %s)", page, got)
		}
		// and not only because the content security policy blocked it: the
		// data made no element (a script, an event handler, a javascript: link)
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](
			`document.querySelectorAll('main script, [onerror], [onmouseover], a[href^="javascript:"]').length`))
		if err != nil {
			t.Fatalf("%s: %v", page, err)
		}
		if n != 0 {
			t.Errorf("%s holds %d elements made from the data (script, event handler or javascript: link)", page, n)
		}
	}
	run(t, ctx, c, "the queue shows the hostile items",
		textUntil(c.url+"/review", "#queue", hostileTask),
		textUntil(c.url+"/review", "#queue", "t-hostile-out"),
	)
	queue := text(t, ctx, c, "#queue")
	for _, want := range []string{"<script>", "javascript:" + pwn} {
		if !strings.Contains(queue, want) {
			t.Errorf("the queue does not show %q as text", want)
		}
	}
	inert("the queue")

	for _, task := range []string{hostileTask, "t-hostile-out", "t-hostile-big"} {
		run(t, ctx, c, "timeline of "+task, chromedp.Navigate(c.url+"/task?"+url.Values{"id": {task}}.Encode()), chromedp.WaitVisible(css("#timeline")))
		inert("the timeline of " + task)
	}
	run(t, ctx, c, "the dead letter shows the hostile record",
		textUntil(c.url+"/deadletter", "main", hostileTask),
		chromedp.Click(css("details summary")),
	)
	inert("the dead-letter page")
	run(t, ctx, c, "operator log", chromedp.Navigate(c.url+"/operators"), chromedp.WaitVisible(css("#operator-log")))
	inert("the operator log")
	run(t, ctx, c, "alerts", chromedp.Navigate(c.url+"/alerts"), chromedp.WaitVisible(css("#alerts")))
	inert("the alerts")
}
