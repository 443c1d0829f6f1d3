package checker

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// headerRun writes the logs of one hallucination of template tpl (task h-1)
// on instance a: its alert (headers alertHdrs, reason alertReason), the
// template's OPEN transition at the decision (headers openHdrs, reason
// openReason) and a HALF_OPEN a cooldown and a second later, which only a
// latched breaker must not do.
func headerRun(t *testing.T, alertReason string, alertHdrs []kgo.RecordHeader, openReason string, openHdrs []kgo.RecordHeader) *Report {
	b := newLog(t)
	p := policy.Default()
	h := event.TaskEvent{EventID: "e-h", TaskID: "h-1", Attempt: 1, OccurredAt: event.At(b.t0), Source: "w", Action: "refund",
		Provider: "openai", Model: "gpt-4o", PromptTemplate: "tpl", Stage: event.StageModel, Status: event.StatusOK,
		Output: &event.Output{Text: "Refund per policy 99.", SchemaValid: ptrTo(true), Confidence: ptrTo(0.95), Flags: []string{"fabricated_data"}},
		Usage:  event.Usage{CostUSD: 0.01, Tokens: 10, ElapsedMs: 100}}
	var st task.State
	in := b.input(0, h)
	d := p.Decide(&h, &st, in.Timestamp.Add(100*time.Millisecond))
	b.routed("audit", in, &h, audited(d))
	b.routed("review", in, &h, d)
	b.alert(event.BreakerEvent{Scope: "PROMPT_TEMPLATE", Key: "tpl", Kind: "ALERT", Reason: alertReason,
		Class: d.Class, TaskID: "h-1", Instance: "a", At: d.DecidedAt}, alertHdrs...)
	b.alert(event.BreakerEvent{Scope: "PROMPT_TEMPLATE", Key: "tpl", Kind: "TRANSITION", From: "CLOSED", To: "OPEN",
		Reason: openReason, Class: event.ClassHallucination, TaskID: "h-1", Instance: "a", At: d.DecidedAt}, openHdrs...)
	cooldown := time.Duration(p.Breakers.PromptTemplate.CooldownMs) * time.Millisecond
	b.alert(event.BreakerEvent{Scope: "PROMPT_TEMPLATE", Key: "tpl", Kind: "TRANSITION", From: "OPEN", To: "HALF_OPEN",
		Reason: "cooldown over; letting probes through", Instance: "a", At: event.At(d.DecidedAt.Add(cooldown + time.Second))},
		kgo.RecordHeader{Key: codec.HeaderBreakerLatched, Value: []byte("false")})
	return b.check()
}

// Guards the checker's reading of the breaker facts the router states in
// headers: whether a transition latched its breaker is its
// faultrouter.breaker.latched header and what an alert is about its
// faultrouter.alert header, whatever their reasons say; a reason is never
// parsed, so a record without the headers neither latches nor alerts.
func TestCheckerReadsBreakerHeaders(t *testing.T) {
	hdr := func(k, v string) []kgo.RecordHeader { return []kgo.RecordHeader{{Key: k, Value: []byte(v)}} }
	quarantined := hdr(codec.HeaderAlert, codec.AlertQuarantined)
	cases := []struct {
		name        string
		alertReason string
		alertHdrs   []kgo.RecordHeader
		openReason  string
		openHdrs    []kgo.RecordHeader
		latch       int // breaker.latch violations: the template half-opened while latched
		missing     int // alerts.missing: the hallucination's alert not found
	}{
		{"the latched header, any reason", "something happened", quarantined, "tripped", hdr(codec.HeaderBreakerLatched, "true"), 1, 0},
		{"not latched by its header, whatever its reason", "something happened", quarantined,
			"MODEL_HALLUCINATION: open until a person resets it", hdr(codec.HeaderBreakerLatched, "false"), 0, 0},
		{"an alert is what its header says, not its reason", "output quarantined: fabricated", hdr(codec.HeaderAlert, codec.AlertSurge),
			"tripped", hdr(codec.HeaderBreakerLatched, "true"), 1, 1},
		{"a record without the headers: its reasons are not read", "output quarantined: fabricated", nil,
			"MODEL_HALLUCINATION: open until a person resets it", nil, 0, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rep := headerRun(t, c.alertReason, c.alertHdrs, c.openReason, c.openHdrs)
			if got := rep.ViolationsByCheck["breaker.latch"]; got != c.latch {
				t.Errorf("breaker.latch violations: %d, want %d: %v", got, c.latch, rep.Violations)
			}
			if got := rep.ViolationsByCheck["alerts.missing"]; got != c.missing {
				t.Errorf("alerts.missing violations: %d, want %d: %v", got, c.missing, rep.Violations)
			}
		})
	}
}
