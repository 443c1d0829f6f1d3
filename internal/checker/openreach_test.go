package checker

import (
	"strings"
	"testing"
	"time"

	"github.com/faultrouter/faultrouter/pkg/event"
)

// openState appends instance a's (producer 7) OPEN state of the
// openai/gpt-4o breaker, opened at at and committed 50 ms later, and, when
// closedAt is not zero, the CLOSED tombstone another instance wrote then;
// else the tombstone a writes when it lets the breaker go, 5 min later
// (breaker.shared_not_let_go).
func (b *logBuilder) openState(at, closedAt time.Time) {
	v, err := event.EncodeBreakerState(&event.BreakerState{Scope: "PROVIDER_MODEL", Key: "openai/gpt-4o", State: "OPEN",
		OpenedAt: ptrTo(event.At(at)), Reason: "failure ratio 0.6 over 20 requests", UpdatedAt: event.At(at), Instance: "a"})
	if err != nil {
		b.t.Fatal(err)
	}
	b.breakerRec(event.BreakerStateKey("PROVIDER_MODEL", "openai/gpt-4o"), v, "a", 7, at, at.Add(50*time.Millisecond))
	if !closedAt.IsZero() {
		b.breakerRec(event.BreakerStateKey("PROVIDER_MODEL", "openai/gpt-4o"), nil, "c", 9, closedAt, closedAt.Add(50*time.Millisecond))
		return
	}
	letGo := at.Add(5 * time.Minute)
	b.breakerRec(event.BreakerStateKey("PROVIDER_MODEL", "openai/gpt-4o"), nil, "a", 7, letGo, letGo.Add(50*time.Millisecond))
}

// openElsewhereRun writes the logs of two instances: a's provider/model
// breaker trips 9 s into the run (cooldown 30 s, the default policy's), and
// b publishes a retry into that model at publish after its due time (about
// 12 s in). With closedAt set, another instance's CLOSED of the breaker
// follows on the topic then.
func openElsewhereRun(t *testing.T, publish time.Duration, closedAt time.Duration) *Report {
	b := newLog(t)
	var closed time.Time
	if closedAt > 0 {
		closed = b.t0.Add(closedAt)
	}
	b.openState(b.t0.Add(9*time.Second), closed)
	b.retryOnB(t, 2, func(due time.Time) time.Time { return due.Add(publish) })
	return b.check()
}

// Guards breaker.open_everywhere: an ordinary OPEN that instance a writes
// to the breakers topic holds instance b's retries into the breaker from
// openReach after it became readable until its cooldown ends, unless a
// later record of the breaker ends it first.
func TestOpenHoldsEverywhere(t *testing.T) {
	rep := openElsewhereRun(t, 0, 0)
	if rep.ViolationsByCheck["breaker.open_everywhere"] != 1 {
		t.Fatalf("a retry published on b into a breaker a opened 3 s before: %d breaker.open_everywhere violations, want 1: %v",
			rep.ViolationsByCheck["breaker.open_everywhere"], rep.Violations)
	}
	if v := rep.Violations[0]; v.Task != "t-1" || !strings.Contains(v.Detail, "offset 0") || !strings.Contains(v.Detail, "PROVIDER_MODEL/openai/gpt-4o") {
		t.Errorf("the violation does not name the retry's task, the breaker and the OPEN's offset: %+v", v)
	}

	// b held it until the cooldown ended
	rep = openElsewhereRun(t, 30*time.Second, 0)
	if !rep.OK() {
		var s strings.Builder
		rep.WriteText(&s)
		t.Fatalf("b held the retry until the cooldown ended, yet: %s", s.String())
	}
	if rep.Open.Opens != 1 || rep.Open.Checked != 1 || rep.Open.Held != 1 || rep.Open.Retries != 1 {
		t.Fatalf("open report %+v, want 1 OPEN checked and 1 retry held by another instance's OPEN", rep.Open)
	}

	// another instance closed the breaker (its later record) before b
	// published: the OPEN no longer holds
	rep = openElsewhereRun(t, 0, 10*time.Second)
	if rep.ViolationsByCheck["breaker.open_everywhere"] != 0 {
		t.Fatalf("a retry published after a later CLOSED of the breaker: %v", rep.Violations)
	}

	// within openReach of its commit the OPEN may not have reached b yet
	b := newLog(t)
	b.openState(b.t0.Add(11*time.Second), time.Time{})
	b.retryOnB(t, 2, func(time.Time) time.Time { return b.t0.Add(11*time.Second + openReach) })
	if rep := b.check(); rep.ViolationsByCheck["breaker.open_everywhere"] != 0 {
		t.Fatalf("a retry published %s after the OPEN was written, within its reach: %v", openReach, rep.Violations)
	}
}
