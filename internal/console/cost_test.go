package console

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// Guards the Cost page: the totals of the audit records read (a redelivery
// not counted; failed is every attempt not SUCCEEDED; cost prevented as the
// audit record carries it), an SVG bar per hour with spend, the models and
// templates by failed spend; a viewer may look; no session, no page; a range
// not offered is a clear 400.
func TestCostPage(t *testing.T) {
	base, opts, set := testConsole(t, Config{Users: testUsers(t)})
	c, _ := codec.New()
	audit, _ := set.Name("audit")
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	now := time.Now()
	mk := func(id string, cost float64, class event.Class, route event.Route, prevented *event.Prevented) *kgo.Record {
		r := event.Routed{
			Event: &event.TaskEvent{EventID: id, TaskID: "t-9", Attempt: 1, OccurredAt: event.At(now), Source: "test", Action: "refund",
				Provider: "openai", Model: "gpt-4o", PromptTemplate: "refund-v9", Status: event.StatusError, Usage: event.Usage{CostUSD: cost}},
			Decision: event.Decision{Class: class, Route: route, Rule: "test", DecidedAt: event.At(now), Prevented: prevented,
				Totals: event.Totals{Attempts: 3, CostUSD: 0.06}},
		}
		v, err := c.EncodeRouted(nil, &r)
		if err != nil {
			t.Fatal(err)
		}
		return &kgo.Record{Topic: audit, Key: []byte("t-9"), Value: v, Timestamp: now}
	}
	recs := []*kgo.Record{
		mk("e-1", 0.01, event.ClassNetworkTimeout, event.RouteRetry, nil),
		mk("e-1", 0.01, event.ClassNetworkTimeout, event.RouteDrop, nil),
		mk("e-2", 0.02, event.ClassNetworkTimeout, event.RouteDeadLetter, &event.Prevented{Stop: "dead_letter", BaselineRetries: 3, Attempts: 1, USD: 0.02}),
		mk("e-3", 0.05, event.ClassSucceeded, event.RouteComplete, nil),
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	anon := newClient(t, base)
	if code, _ := anon.do(http.MethodGet, "/cost", nil); code != http.StatusSeeOther {
		t.Errorf("GET /cost without a session: %d, want 303 to the sign-in", code)
	}
	v := newClient(t, base)
	v.login("victor")
	var body string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var code int
		code, body = v.do(http.MethodGet, "/cost", nil)
		if code != http.StatusOK {
			t.Fatalf("GET /cost: %d\n%s", code, body)
		}
		if strings.Contains(body, `id="cost-total">$0.08<`) {
			break
		}
	}
	for _, want := range []string{`id="cost-total">$0.08<`, `id="cost-failed">$0.03<`, `id="cost-succeeded">$0.05<`,
		`id="cost-prevented">$0.02<`, `<rect class="seg"`, "NETWORK_TIMEOUT", "openai/gpt-4o", "refund-v9"} {
		if !strings.Contains(body, want) {
			t.Errorf("the Cost page lacks %q", want)
		}
	}
	if n := strings.Count(body, `<rect class="seg"`); n != 3 {
		t.Errorf("%d chart segments, want 3 (two classes spent this hour, one hour prevented)", n)
	}
	if code, body := v.do(http.MethodGet, "/cost?hours=13", nil); code != http.StatusBadRequest || !strings.Contains(body, "allowed [6 24 168 720]") {
		t.Errorf("GET /cost?hours=13: %d, want 400 naming the allowed ranges", code)
	}
}
