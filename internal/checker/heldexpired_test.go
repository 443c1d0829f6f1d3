package checker

import (
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// heldRetryRun writes a timeout of task t-1 (SLA sla) decided RETRY and
// audited, and, if open, its provider/model breaker opening at that
// decision: the start of a retry that breakers hold. It returns the log, the
// event, its input record, the task state after the decision and the
// decision.
func heldRetryRun(t *testing.T, sla int64, open bool) (*logBuilder, event.TaskEvent, *kgo.Record, *task.State, event.Decision) {
	t.Helper()
	b := newLog(t)
	ev := timeout("t-1", "e-1", 1, b.t0)
	ev.SLAMs = ptrTo(sla)
	st := &task.State{}
	in := b.input(0, ev)
	d := policy.Default().DecideEvent(&ev, st, nil, in.Timestamp.Add(100*time.Millisecond))
	if d.Route != event.RouteRetry {
		t.Fatalf("decision %s (%s), want a retry", d.Route, d.Reason)
	}
	b.routed("audit", in, &ev, audited(d))
	if open {
		b.alert(event.BreakerEvent{Scope: "PROVIDER_MODEL", Key: "openai/gpt-4o", Kind: "TRANSITION", From: "CLOSED", To: "OPEN",
			Class: event.ClassNetworkTimeout, TaskID: "t-1", Instance: "a", At: d.DecidedAt})
	}
	return b, ev, in, st, d
}

// Guards the checker's reading of a retry given up behind breakers (rule
// retry.held_expired, to the dead-letter topic): it ends its RETRY decision
// as a publication does, once. It is accepted when the retry was held until
// 2 x its task's SLA after its due time, and reported when it came earlier
// (retry.held_expired), when the retry could have been published long
// before (retry.late: no breaker held it), and when the retry was also
// published (retry.duplicate).
func TestRetryGivenUpBehindBreakers(t *testing.T) {
	const sla = int64(60_000)
	cases := []struct {
		name       string
		check      string        // "" for none
		giveUpAt   time.Duration // after the retry's due time
		open       bool          // a breaker of the retry is OPEN from its decision on
		alsoPublic bool
	}{
		{"held until its lifetime ended", "", 2*time.Duration(sla)*time.Millisecond + time.Millisecond, true, false},
		{"given up early", "retry.held_expired", time.Duration(sla) * time.Millisecond, true, false},
		{"given up though publishable", "retry.late", 2*time.Duration(sla)*time.Millisecond + time.Millisecond, false, false},
		{"given up and published", "retry.duplicate", 2*time.Duration(sla)*time.Millisecond + time.Millisecond, true, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, ev, in, st, d := heldRetryRun(t, sla, c.open)
			due := d.Retry.NotBefore.Time
			gave := policy.RetryHeldExpired(st, "PROVIDER_MODEL/openai/gpt-4o (OPEN)", due.Add(c.giveUpAt))
			b.routed("deadletter", in, &ev, gave)
			if c.alsoPublic {
				pub := d
				pub.DecidedAt = event.At(due.Add(c.giveUpAt + time.Second))
				b.routed("retry", nil, &ev, pub)
			}
			b.logs.End = due.Add(c.giveUpAt + time.Minute)
			rep := b.check()
			var s strings.Builder
			rep.WriteText(&s)
			switch {
			case c.check == "" && !rep.OK():
				t.Fatalf("a correct router's give-up: %s", s.String())
			case c.check == "" && rep.HeldExpired != 1:
				t.Fatalf("HeldExpired = %d, want 1: %s", rep.HeldExpired, s.String())
			case c.check != "" && rep.ViolationsByCheck[c.check] == 0:
				t.Fatalf("no %s violation; got %v\n%s", c.check, rep.ViolationsByCheck, s.String())
			}
		})
	}
}

// Guards the matching of a retry published after its earlier retry of the
// same number was given up: the worker redelivers the same event after the
// task's state expired (a fresh state, the retry numbers start again), and
// the retry published for it (its plan's time moved, as a released held
// retry's is) answers the new decision, not the given-up one; neither is
// reported twice or missing.
func TestRetryAfterAGiveUpMatchesTheNewDecision(t *testing.T) {
	const sla = int64(60_000)
	b, ev, in, st, d := heldRetryRun(t, sla, true)
	p := policy.Default()
	lifetime := 2 * time.Duration(sla) * time.Millisecond
	gaveAt := d.Retry.NotBefore.Add(lifetime + time.Millisecond)
	b.alert(event.BreakerEvent{Scope: "PROVIDER_MODEL", Key: "openai/gpt-4o", Kind: "TRANSITION", From: "OPEN", To: "CLOSED",
		Reason: "reset", Instance: "a", At: event.At(gaveAt.Add(time.Second))})
	b.routed("deadletter", in, &ev, policy.RetryHeldExpired(st, "PROVIDER_MODEL/openai/gpt-4o (OPEN)", gaveAt))

	// the same event again once the task's state expired (2 x SLA after the
	// give-up): decided on a fresh state, retry 1 again
	b.tombstone("t-1", gaveAt.Add(lifetime+time.Millisecond))
	at2 := gaveAt.Add(lifetime + 5*time.Second)
	in2 := b.inputAt(1, ev, at2.Add(-100*time.Millisecond))
	*st = task.State{}
	d2 := p.DecideEvent(&ev, st, nil, at2)
	if d2.Route != event.RouteRetry || d2.Retry.N != 1 {
		t.Fatalf("decision on a fresh state: %s retry %v (%s), want retry 1", d2.Route, d2.Retry, d2.Reason)
	}
	b.routed("audit", in2, &ev, audited(d2))
	b.repeat(policy.RepeatAfterTTL) // as the router names an attempt of a task it forgot
	pub := d2
	moved := d2.Retry.NotBefore.Add(time.Millisecond)
	pub.DecidedAt = event.At(moved)
	pub.Retry = &event.RetryPlan{N: 1, DelayMs: d2.Retry.DelayMs, NotBefore: event.At(moved)}
	b.routed("retry", nil, &ev, pub)
	b.logs.End = moved.Add(time.Second)
	rep := b.check()
	if !rep.OK() || rep.HeldExpired != 1 {
		var s strings.Builder
		rep.WriteText(&s)
		t.Fatalf("HeldExpired %d, want 1; %s", rep.HeldExpired, s.String())
	}
}
