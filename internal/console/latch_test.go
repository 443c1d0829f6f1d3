package console

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// Guards what the queue tells a reviewer about a latched prompt template:
// on each open item of a hallucination of it, whether deciding the item
// reopens the template or how many other items keep it offline, counting an
// item already decided (waiting for the router) as no longer holding it.
func TestQueueSaysWhatDecidingAHallucinationDoesToItsTemplate(t *testing.T) {
	opts, set := testCluster(t)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	c, _ := codec.New()
	review, _ := set.Name("review")
	alerts, _ := set.Name("alerts")
	now := time.Now()
	for _, task := range []string{"h-1", "h-2"} {
		v, err := c.EncodeRouted(nil, &event.Routed{
			Event: &event.TaskEvent{EventID: "e-" + task, TaskID: task, Attempt: 1, OccurredAt: event.At(now), Source: "test", Action: "refund",
				Status: event.StatusOK, PromptTemplate: "tpl-x"},
			Decision: event.Decision{Class: event.ClassHallucination, Route: event.RouteQuarantine, Rule: "test", Reason: "fabricated",
				Review: &event.Review{Owner: "ai_product", SLAMs: 60_000}, DecidedAt: event.At(now)}})
		if err != nil {
			t.Fatal(err)
		}
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: review, Key: []byte(task), Value: v}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	v, err := c.EncodeBreakerEvent(nil, &event.BreakerEvent{Scope: "PROMPT_TEMPLATE", Key: "tpl-x", Kind: event.BreakerKindTransition,
		From: "CLOSED", To: "OPEN", Reason: "MODEL_HALLUCINATION: open until a person resets it", Class: event.ClassHallucination, TaskID: "h-1", Instance: "a", At: event.At(now)})
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: alerts, Key: []byte("PROMPT_TEMPLATE/tpl-x"), Value: v,
		Headers: []kgo.RecordHeader{{Key: codec.HeaderBreakerLatched, Value: []byte("true")}}}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	base, _ := startConsole(t, opts, set, Config{Users: testUsers(t)})
	alice := newClient(t, base)
	alice.login("alice")
	waitFor := func(what string, ok func(string) bool) string {
		deadline := time.Now().Add(10 * time.Second)
		for {
			_, body := alice.do(http.MethodGet, "/review", nil)
			if ok(body) {
				return body
			}
			if time.Now().After(deadline) {
				t.Fatalf("the queue never showed %s:\n%s", what, body)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	body := waitFor("two notes that the other item keeps tpl-x offline", func(b string) bool {
		return strings.Count(b, "1 more item keeps tpl-x offline") == 2
	})
	if strings.Contains(body, "reopens template") {
		t.Fatalf("with two items open, a note says deciding one reopens the template:\n%s", body)
	}
	if code, b := alice.do(http.MethodPost, "/review/decide", url.Values{"csrf": {alice.token("/review")}, "task": {"h-1"},
		"action": {"approve"}, "reason": {"checked: no fabrication"}}); code >= 400 {
		t.Fatalf("deciding h-1: %d %s", code, b)
	}
	waitFor("that deciding h-2 reopens tpl-x", func(b string) bool {
		return strings.Count(b, "deciding it reopens template tpl-x") == 1 && strings.Count(b, "1 more item keeps tpl-x offline") == 1
	})
}
