package router

import (
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
)

// adoptRouter is a router with only what adopting shared breaker states
// needs: the default policy's breakers, the codec, instance "b".
func adoptRouter(t *testing.T) *Router {
	t.Helper()
	brk, err := newBreakers(policy.Default(), nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := codec.New()
	if err != nil {
		t.Fatal(err)
	}
	r := &Router{cfg: Config{InstanceID: "b", Topics: Topics{Alerts: "alerts", Breakers: "breakers"}},
		codec: c, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	r.attachBreakers(brk)
	return r
}

func remote(state string, latched, reset bool, at time.Time) event.BreakerState {
	s := event.BreakerState{Scope: breaker.PromptTemplate.String(), Key: "tpl", State: state, Latched: latched, Reset: reset,
		Reason: "why", UpdatedAt: event.At(at), Instance: "a"}
	if state == breaker.Open.String() {
		o := event.At(at)
		s.OpenedAt = &o
	}
	return s
}

// Guards the rules that keep a latch until a person resets it, whatever
// order the instances' states arrive in: a latch from another instance is
// adopted (and announced on the alerts topic as adopted); a later CLOSED
// that is not a reset (an instance that had not seen the latch closing on
// its probes) does not undo it; a reset older than the latch does not
// either; a newer reset does, and marks the breaker closed so that its held
// retries are released; a latch older than that reset is not adopted again.
func TestAdoptKeepsALatchUntilAReset(t *testing.T) {
	r := adoptRouter(t)
	ref := breaker.Ref{Scope: breaker.PromptTemplate, Key: "tpl"}
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)
	b := newBatch()
	apply := func(s event.BreakerState) {
		r.brk.adopt(ref, &s, b, t0.Add(time.Hour))
	}

	apply(remote(breaker.Open.String(), true, false, t0))
	if !r.brk.set.Latched(ref) {
		t.Fatal("a latch from instance a was not adopted")
	}
	if len(r.brk.events) != 1 || r.brk.events[0].To != breaker.Open.String() || !strings.HasPrefix(r.brk.events[0].Reason, "adopted from a: ") {
		t.Fatalf("adopting the latch queued %+v, want one OPEN transition reasoned 'adopted from a: ...'", r.brk.events)
	}
	apply(remote(breaker.Closed.String(), false, false, t0.Add(time.Minute)))
	apply(remote(breaker.HalfOpen.String(), false, false, t0.Add(2*time.Minute)))
	apply(remote(breaker.Closed.String(), false, true, t0.Add(-time.Minute)))
	if !r.brk.set.Latched(ref) {
		t.Fatal("a CLOSED that is not a reset, a HALF_OPEN, or a reset older than the latch undid the latch")
	}
	apply(remote(breaker.Closed.String(), false, true, t0.Add(3*time.Minute)))
	if r.brk.set.State(ref) != breaker.Closed || !r.brk.closed[ref] {
		t.Fatalf("a reset newer than the latch left the breaker %s (closed for release: %v), want CLOSED", r.brk.set.State(ref), r.brk.closed[ref])
	}
	apply(remote(breaker.Open.String(), true, false, t0.Add(time.Minute)))
	if r.brk.set.State(ref) != breaker.Closed {
		t.Fatal("a latch older than the reset applied was adopted again")
	}
	apply(remote(breaker.Open.String(), true, false, t0.Add(4*time.Minute)))
	if !r.brk.set.Latched(ref) {
		t.Fatal("a latch newer than the reset was not adopted")
	}
}

// Guards "last writer wins" for states that are not latches: a state older
// than this instance's own last change of the breaker is not adopted; a
// newer OPEN is, keeping the time it opened on its writer, so that the
// retries held here wait for the writer's cooldown and its probes.
func TestAdoptIgnoresStatesOlderThanTheLastChangeHere(t *testing.T) {
	r := adoptRouter(t)
	ref := breaker.Ref{Scope: breaker.PromptTemplate, Key: "tpl"}
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)
	b := newBatch()
	r.brk.share(ref, "own change", false, b, t0.Add(10*time.Second)) // this instance wrote CLOSED at t0+10s
	if len(b.out) != 1 || b.out[0].Topic != "breakers" || string(b.out[0].Key) != "PROMPT_TEMPLATE/tpl" {
		t.Fatalf("share queued %v, want one record on the breakers topic keyed PROMPT_TEMPLATE/tpl", b.out)
	}
	if s, err := event.DecodeBreakerState(b.out[0].Value); err != nil || s.State != breaker.Closed.String() || s.Instance != "b" {
		t.Fatalf("the shared state decodes to %+v, %v; want CLOSED by b", s, err)
	}
	old := remote(breaker.Open.String(), false, false, t0.Add(5*time.Second))
	r.brk.adopt(ref, &old, b, t0.Add(11*time.Second))
	if r.brk.set.State(ref) != breaker.Closed {
		t.Fatal("an OPEN older than this instance's own last change was adopted")
	}
	newer := remote(breaker.Open.String(), false, false, t0.Add(20*time.Second))
	r.brk.adopt(ref, &newer, b, t0.Add(21*time.Second))
	if r.brk.set.State(ref) != breaker.Open {
		t.Fatal("a newer OPEN was not adopted")
	}
	cooldown := time.Duration(policy.Default().Breakers.PromptTemplate.CooldownMs) * time.Millisecond
	if got, want := r.brk.set.HoldUntil([]breaker.Ref{ref}, t0.Add(21*time.Second)), t0.Add(20*time.Second+cooldown+cooldown/4); !got.Equal(want) {
		t.Fatalf("a retry behind the adopted OPEN is held until %s, want a recheck step after the writer's cooldown end, %s", got, want)
	}
}

// Guards the reader's bookkeeping: before the initial read is done, this
// instance's own states are kept (a restart restores them); after, they are
// skipped; a batch that did not commit gives its states back unless a newer
// one of the same kind arrived.
func TestBreakerTablePendingStates(t *testing.T) {
	tb := newBreakerTable("breakers", "b", slog.New(slog.NewTextHandler(io.Discard, nil)))
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)
	own := remote(breaker.Open.String(), true, false, t0)
	own.Instance = "b"
	tb.put(own)
	if p := tb.take(); len(p) != 1 || p[0].Instance != "b" {
		t.Fatalf("before the initial read is done, the own state was not kept: %v", p)
	}
	tb.done = true
	tb.put(own)
	if p := tb.take(); len(p) != 0 {
		t.Fatalf("after the initial read, an own state was kept: %v", p)
	}
	tb.put(remote(breaker.Closed.String(), false, false, t0.Add(time.Second)))
	given := tb.take()
	tb.put(remote(breaker.HalfOpen.String(), false, false, t0.Add(2*time.Second)))
	tb.giveBack(given)
	if p := tb.take(); len(p) != 1 || p[0].State != breaker.HalfOpen.String() {
		t.Fatalf("giveBack replaced a newer pending state: %v", p)
	}
	tb.giveBack(given)
	if p := tb.take(); len(p) != 1 || p[0].State != breaker.Closed.String() {
		t.Fatalf("giveBack lost the state of a batch that did not commit: %v", p)
	}
}

// Guards a latch's way through the reader when other states of its breaker
// follow it before the run loop applies them: a newer state that is not a
// latch, written by an instance that had not seen the latch yet, or this
// instance's own, leaves the latch pending, and the batch adopts it (the
// later state is then ignored by the latched breaker); a batch that did not
// commit gives the latch back though a newer state arrived.
func TestBreakerTableKeepsALatchBehindLaterStates(t *testing.T) {
	ref := breaker.Ref{Scope: breaker.PromptTemplate, Key: "tpl"}
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)
	for _, later := range []string{"another instance's HALF_OPEN", "another instance's CLOSED", "this instance's OPEN"} {
		t.Run(later, func(t *testing.T) {
			r := adoptRouter(t) // instance b
			tb := newBreakerTable("breakers", "b", r.log)
			tb.done = true
			r.brk.table = tb
			tb.put(remote(breaker.Open.String(), true, false, t0)) // a's latch
			var s event.BreakerState
			switch later {
			case "another instance's HALF_OPEN":
				s = remote(breaker.HalfOpen.String(), false, false, t0.Add(time.Second))
			case "another instance's CLOSED":
				s = remote(breaker.Closed.String(), false, false, t0.Add(time.Second))
			default:
				s = remote(breaker.Open.String(), false, false, t0.Add(time.Second))
			}
			s.Instance = map[bool]string{true: "b", false: "c"}[strings.HasPrefix(later, "this")]
			tb.put(s)

			b := newBatch()
			r.brk.begin(t0.Add(2 * time.Second))
			r.brk.adoptShared(b, t0.Add(2*time.Second))
			if !r.brk.set.Latched(ref) {
				t.Fatalf("a's latch, followed by %s, was not adopted: %s", later, r.brk.set.State(ref))
			}
			r.brk.rollback() // the batch did not commit
			tb.put(remote(breaker.HalfOpen.String(), false, false, t0.Add(3*time.Second)))
			b = newBatch()
			r.brk.begin(t0.Add(4 * time.Second))
			r.brk.adoptShared(b, t0.Add(4*time.Second))
			if !r.brk.set.Latched(ref) {
				t.Fatalf("the latch given back by a batch that did not commit was not adopted again: %s", r.brk.set.State(ref))
			}
		})
	}
}

// Guards the order of adoption: states of one breaker read in one interval
// are applied in the order they were written, whatever their times say.
// An instance that applies a RESET and then a LATCH in one batch writes
// both in the same millisecond; applied latch first, the reset undid the
// latch on every other instance.
func TestBreakerTableAppliesStatesInTheOrderWritten(t *testing.T) {
	ref := breaker.Ref{Scope: breaker.PromptTemplate, Key: "tpl"}
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)
	latch := remote(breaker.Open.String(), true, false, t0)
	reset := remote(breaker.Closed.String(), false, true, t0)
	for _, tc := range []struct {
		name    string
		written []event.BreakerState
		latched bool
	}{
		{"a reset, then a latch", []event.BreakerState{reset, latch}, true},
		{"a latch, then a reset", []event.BreakerState{latch, reset}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := adoptRouter(t) // instance b
			tb := newBreakerTable("breakers", "b", r.log)
			tb.done = true
			r.brk.table = tb
			// the breaker was latched here before: the reset has something to undo
			r.brk.set.Trip(ref, "earlier", breaker.Outcome{}, t0.Add(-time.Minute))
			for _, s := range tc.written {
				tb.put(s)
			}
			r.brk.begin(t0.Add(time.Second))
			r.brk.adoptShared(newBatch(), t0.Add(time.Second))
			if got := r.brk.set.Latched(ref); got != tc.latched {
				t.Fatalf("after %s: latched %v, want %v", tc.name, got, tc.latched)
			}
		})
	}
}
