package router_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
)

// Guards an override's breaker limits in the router: with
// `breakers: {provider_model: {min_requests: 3}}` for provider acme, three
// timeouts of acme/m1 open its breaker (an OPEN transition on the alerts
// topic, the next retry of acme/m1 held) while three timeouts of other/m1,
// on the base policy's min_requests of 20, leave its breaker closed.
func TestOverrideBreakerLimitsOpenTheirBreaker(t *testing.T) {
	p, err := policy.Parse([]byte(`overrides:
  - name: acme-breakers
    match: {provider: acme}
    breakers: {provider_model: {min_requests: 3}}
`))
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC).UnixMilli()
	w := expStartPolicy(t, t0, p)
	timeout := func(taskID, provider string) event.TaskEvent {
		return event.TaskEvent{
			EventID: "e-" + taskID, TaskID: taskID, Attempt: 1, OccurredAt: event.At(time.UnixMilli(t0)),
			Source: "limits-test", Action: "answer_ticket", Provider: provider, Model: "m1",
			Stage: event.StageNetwork, Status: event.StatusError, Error: &event.Error{Type: "TimeoutError", Code: "timeout"},
		}
	}
	var tasks []string
	for i := range 3 {
		for _, provider := range []string{"acme", "other"} {
			id := fmt.Sprintf("%s-%d", provider, i)
			tasks = append(tasks, id)
			w.produce(timeout(id, provider))
		}
	}
	for _, id := range tasks {
		w.waitAudit(id, 1)
	}
	opened := func(key string) bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, a := range w.alerts {
			if a.Kind == event.BreakerKindTransition && a.Scope == event.ScopeProviderModel && a.Key == key && a.To == event.BreakerOpen {
				return true
			}
		}
		return false
	}
	if !expWaitFor(30*time.Second, func() bool { return opened("acme/m1") }) {
		t.Fatal("acme/m1 did not open after 3 timeouts; its override sets min_requests 3")
	}
	if opened("other/m1") {
		t.Fatal("other/m1 opened after 3 timeouts; the base policy's min_requests is 20")
	}
	// the retries come due: acme/m1's are held behind its open breaker,
	// other/m1's are published
	w.clock.Store(t0 + 5000)
	w.produce(expSucceeded("e-tick", "tick"))
	w.waitAudit("tick", 1)
	if !expWaitFor(30*time.Second, func() bool { return len(w.retriesOf("other-2")) == 1 }) {
		t.Fatal("other/m1's retry was not published when due")
	}
	for i := range 3 {
		if n := len(w.retriesOf(fmt.Sprintf("acme-%d", i))); n != 0 {
			t.Errorf("acme-%d: %d retries published into the open acme/m1", i, n)
		}
	}
}
