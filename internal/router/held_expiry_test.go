package router_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
)

// Guards the bound on a held retry: a retry that breakers hold is given up
// when its task's lifetime ends (2 x SLA after the retry's due time), to the
// dead-letter topic with rule retry.held_expired, instead of keeping its
// task, its state and its breakers forever behind a provider that never
// comes back. The default policy, breakers on, a router on a fake clock: 25
// rate-limited tasks of acme/m1 (SLA 60 s) open its breaker and are held;
// when it half-opens, one is its probe, and no outcome of a probe ever comes
// (the worker is gone). A cooldown after the last probe went out, the
// breaker lets one new probe through, the next held retry in due order, and
// holds the others meanwhile. Past 2 x SLA after their due times the ones
// still held go to the dead letter, once each, never to the retry topic;
// their states keep no pending retry and then expire like any other. A task
// whose held retry a new decision replaced is not given up.
func TestHeldRetryGivenUpWhenItsTasksLifetimeEnds(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC).UnixMilli()
	w := expStart(t, t0)
	const cooldown = 30_000 // the default policy's provider/model cooldown
	sla := int64(60_000)

	rateLimited := func(taskID string, attempt int32, at, retryAfterMs int64) event.TaskEvent {
		return event.TaskEvent{
			EventID: fmt.Sprintf("e-%s-%d", taskID, attempt), TaskID: taskID, Attempt: attempt, OccurredAt: event.At(time.UnixMilli(at)),
			Source: "held-test", Action: "answer_ticket", Provider: "acme", Model: "m1", SLAMs: &sla,
			Stage: event.StageNetwork, Status: event.StatusError,
			Error: &event.Error{Type: "RateLimitError", HTTPStatus: 429, RetryAfterMs: &retryAfterMs},
		}
	}
	var ids []string
	for i := range 25 {
		id := fmt.Sprintf("gone-%02d", i)
		ids = append(ids, id)
		w.produce(rateLimited(id, 1, t0, 1000+10*int64(i)))
	}
	for _, id := range ids {
		if d := w.waitAudit(id, 1)[0]; d.Route != event.RouteRetry {
			t.Fatalf("%s: %s/%s, want a RETRY", id, d.Class, d.Route)
		}
	}
	// due while acme/m1 is open: held
	w.clock.Store(t0 + 2000)
	for _, id := range ids {
		if !expWaitFor(30*time.Second, func() bool {
			st := w.lastState(id)
			return st != nil && st.Pending != nil && st.Pending.NotBefore >= t0+cooldown
		}) {
			t.Fatalf("%s: not held behind the open breaker: %+v", id, w.lastState(id))
		}
	}
	// half-open: one probe goes out, and its outcome never comes
	w.clock.Store(t0 + cooldown + 2)
	if !expWaitFor(30*time.Second, func() bool { return w.retryCount() >= 1 }) {
		t.Fatal("no probe when the breaker half-opened")
	}
	probe := w.retryTasks()[0]
	// a held retry replaced by a new decision of its task (a second 429 of
	// it within 60 s, from the model it failed over to:
	// RATE_LIMIT_EXCEEDED, dead letter by its class's rule)
	replaced := ids[24]
	if probe == replaced {
		replaced = ids[23]
	}
	again := rateLimited(replaced, 2, t0+cooldown+2, 1000)
	again.Provider, again.Model = "other", "m2" // its outcome is not acme/m1's: the probe stays out
	w.produce(again)
	if d := w.waitAudit(replaced, 2)[1]; d.Rule != policy.RuleRateLimitExceeded {
		t.Fatalf("%s: second 429 decided %s/%s rule %s, want rule %s", replaced, d.Class, d.Route, d.Rule, policy.RuleRateLimitExceeded)
	}

	// the replaced retry is held no more: 23 are (not the probe)
	if !expWaitFor(30*time.Second, func() bool { return w.metric("faultrouter_retries_held") == 23 }) {
		t.Fatalf("faultrouter_retries_held = %v after a held retry was replaced, want 23", w.metric("faultrouter_retries_held"))
	}

	// the probe's outcome does not come: a cooldown after it went out, at
	// the next recheck (a quarter of the cooldown), one new probe, the
	// earliest due of those held; none before
	w.clock.Store(t0 + 2*cooldown + 1)
	time.Sleep(300 * time.Millisecond) // a few ticks of the router's sweep
	if n := w.retryCount(); n != 1 {
		t.Fatalf("%d retries published less than a cooldown after the probe went out, want the probe alone: %v", n, w.retryTasks())
	}
	w.clock.Store(t0 + 2*cooldown + cooldown/4)
	if !expWaitFor(30*time.Second, func() bool { return w.retryCount() >= 2 }) {
		t.Fatal("no new probe a cooldown after the first went out unanswered")
	}
	if got, want := w.retryTasks()[1], nextHeld(ids, probe, replaced); got != want {
		t.Fatalf("new probe %s, want %s: the earliest due of the retries held", got, want)
	}

	// still held just before their lifetimes end, but for one more probe
	// (the clock passed another cooldown after the last)
	w.clock.Store(t0 + 1000 + 2*sla - 1)
	if !expWaitFor(30*time.Second, func() bool { return w.retryCount() >= 3 }) {
		t.Fatal("no third probe a cooldown after the second went out unanswered")
	}
	time.Sleep(300 * time.Millisecond) // a few ticks of the router's sweep
	probes := w.retryTasks()
	if len(probes) != 3 {
		t.Fatalf("retries published by t0%+d ms: %v, want three probes, a cooldown apart", 1000+2*sla-1, probes)
	}
	for _, id := range ids {
		for _, r := range w.deadOf(id) {
			if r.Decision.Rule == policy.RuleRetryHeldExpired {
				t.Fatalf("%s given up at t0%+d ms, before its lifetime ended (due t0+%d + 2 x SLA)", id, r.Decision.DecidedAt.UnixMilli()-t0, 1000)
			}
		}
	}
	// past every one's due time + 2 x SLA
	w.clock.Store(t0 + 1000 + 10*24 + 2*sla + 1)
	var given []string
	for _, id := range ids {
		if slices.Contains(probes, id) || id == replaced {
			continue
		}
		given = append(given, id)
		if !expWaitFor(30*time.Second, func() bool { return len(w.deadOf(id)) >= 1 }) {
			t.Fatalf("%s: its retry, held past its task's lifetime, was not dead-lettered; state %+v; retries %v", id, w.lastState(id), w.retryTasks())
		}
	}
	time.Sleep(300 * time.Millisecond)
	for i, id := range given {
		ds := w.deadOf(id)
		if len(ds) != 1 {
			t.Fatalf("%s: %d dead letters, want 1", id, len(ds))
		}
		d := ds[0].Decision
		due := t0 + 1000 + 10*int64(slices.Index(ids, id))
		if d.Rule != policy.RuleRetryHeldExpired || d.Route != event.RouteDeadLetter || d.Class != event.ClassRateLimited ||
			d.Retry == nil || d.Retry.N != 1 || d.Retry.NotBefore.UnixMilli() != due {
			t.Fatalf("%s: dead letter %s/%s rule %s retry %+v, want RATE_LIMITED/DEADLETTER rule %s, retry 1 due t0%+d",
				id, d.Class, d.Route, d.Rule, d.Retry, policy.RuleRetryHeldExpired, due-t0)
		}
		if at := d.DecidedAt.UnixMilli(); at < due+2*sla {
			t.Fatalf("%s: given up at t0%+d ms, before due + 2 x SLA (t0%+d)", id, at-t0, due+2*sla-t0)
		}
		if st := w.lastState(id); st == nil || st.Pending != nil {
			t.Fatalf("%s: state after the give-up %+v, want one with no pending retry", id, st)
		}
		if i == 0 {
			t.Logf("reason: %s", d.Reason)
		}
	}
	if got := w.retryTasks(); !slices.Equal(got, probes) {
		t.Fatalf("retry topic holds %v, want only the probes %v", got, probes)
	}
	for _, id := range append(probes, replaced) {
		for _, r := range w.deadOf(id) {
			if r.Decision.Rule == policy.RuleRetryHeldExpired {
				t.Fatalf("%s: given up, but its retry was %s", id, map[bool]string{true: "published", false: "replaced"}[id != replaced])
			}
		}
	}
	if n, h := w.metric("faultrouter_retries_held_expired_total"), w.metric("faultrouter_retries_held"); n != float64(len(given)) || h != 0 {
		t.Fatalf("faultrouter_retries_held_expired_total = %v, faultrouter_retries_held = %v; want %d and 0", n, h, len(given))
	}
	// and the given-up tasks then expire 2 x SLA later
	w.clock.Store(t0 + 1000 + 10*24 + 4*sla + 3_600_000 + 2)
	for _, id := range given {
		if !expWaitFor(30*time.Second, func() bool { return w.tombstones(id) == 1 }) {
			t.Fatalf("%s: never expired after its retry was given up; state %+v", id, w.lastState(id))
		}
	}
}

// nextHeld is the first of ids, in due order, that is neither the probe
// nor the task whose held retry was replaced.
func nextHeld(ids []string, probe, replaced string) string {
	for _, id := range ids {
		if id != probe && id != replaced {
			return id
		}
	}
	return ""
}
