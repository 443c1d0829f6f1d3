package checker

import (
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// Guards breaker.not_let_go: a breaker that opened and that nothing used
// since must be let go (closed and forgotten) within its idle time plus
// RetryLate. A router that lets it go passes; one that keeps it HALF_OPEN
// to the end of the run is reported, and so is one that kept it past the
// bound before a person reset it. A latched breaker is never let go, and
// an instance stopped for good (a scale-down) lets nothing go: its
// breakers went with it.
func TestBreakersNoOneUsesAreLetGo(t *testing.T) {
	cfg := policy.Default().Breakers.Downstream.Config()
	idle := breaker.IdleOf(cfg)
	cases := []struct {
		name  string
		check string   // "" for none
		after []string // the transitions after the OPEN: "to@offset from the OPEN"
		latch bool
	}{
		{"let go", "", []string{"HALF_OPEN@cooldown", "CLOSED@letgo"}, false},
		{"kept half-open", "breaker.not_let_go", []string{"HALF_OPEN@cooldown"}, false},
		{"kept until a reset", "breaker.not_let_go", []string{"HALF_OPEN@cooldown", "CLOSED@late"}, false},
		{"latched", "", nil, true},
		{"its instance stopped for good", "", []string{"HALF_OPEN@cooldown", "STOP@cooldown"}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := newLog(t)
			p := policy.Default()
			ev := timeout("t-1", "e-1", 1, b.t0)
			ev.Stage, ev.Error = event.StageBusiness, &event.Error{Type: "BusinessError", HTTPStatus: 422, Message: "insufficient_balance"}
			var st task.State
			in := b.input(0, ev)
			d := p.DecideEvent(&ev, &st, nil, in.Timestamp.Add(100*time.Millisecond))
			if d.Route != event.RouteReview {
				t.Fatalf("decision %s/%s (%s), want a review", d.Class, d.Route, d.Reason)
			}
			b.routed("audit", in, &ev, audited(d))
			b.routed("review", in, &ev, d)
			open := d.DecidedAt.Time
			tr := event.BreakerEvent{Scope: "DOWNSTREAM", Key: "refund", Kind: "TRANSITION", From: "CLOSED", To: "OPEN",
				Class: d.Class, TaskID: "t-1", Instance: "a", At: event.At(open)}
			if c.latch { // as `faultrouter breaker latch` latches it
				b.alert(tr, kgo.RecordHeader{Key: codec.HeaderBreakerLatched, Value: []byte("true")})
			} else {
				b.alert(tr)
			}
			from := event.BreakerOpen
			for _, a := range c.after {
				to, when, _ := strings.Cut(a, "@")
				at := open.Add(cfg.Cooldown + time.Millisecond)
				switch when {
				case "letgo":
					at = open.Add(idle + time.Second)
				case "late":
					at = open.Add(cfg.Cooldown + idle + 3*time.Minute) // RetryLate: 60 s and the longest cooldown
				}
				if to == "STOP" { // instance a stops, and no process of it starts again
					b.stops = map[string][]time.Time{"a": {at.Add(time.Second)}}
					continue
				}
				b.alert(event.BreakerEvent{Scope: "DOWNSTREAM", Key: "refund", Kind: "TRANSITION", From: from, To: event.BreakerStateName(to),
					Reason: when, Instance: "a", At: event.At(at)})
				from = event.BreakerStateName(to)
			}
			b.logs.End = open.Add(idle + time.Hour)
			rep := b.check()
			var s strings.Builder
			rep.WriteText(&s)
			switch {
			case c.check == "" && rep.ViolationsByCheck["breaker.not_let_go"] != 0:
				t.Fatalf("breaker.not_let_go reported:\n%s", s.String())
			case c.check != "" && rep.ViolationsByCheck[c.check] == 0:
				t.Fatalf("no %s violation; got %v\n%s", c.check, rep.ViolationsByCheck, s.String())
			}
		})
	}
}

// Guards breaker.shared_not_let_go: a breaker that nothing uses any more
// has its OPEN or HALF_OPEN state tombstoned on the breakers topic within
// its idle time plus LetGoLate, so that an instance that starts does not
// adopt it again. A router that lets it go passes; one whose last record of
// the breaker stays OPEN is reported, unless a RESET ended the state or an
// instance started (and adopted it) recently enough.
func TestSharedStatesOfIdleBreakersAreTombstoned(t *testing.T) {
	idle := breaker.IdleOf(policy.Default().Breakers.ProviderModel.Config())
	key := event.BreakerStateKey("PROVIDER_MODEL", "openai/gpt-4o")
	cases := []struct {
		name   string
		check  string // "" for none
		after  func(b *logBuilder, open time.Time)
		end    time.Duration // after the OPEN
		starts []time.Duration
		idle   int // Report.IdleShared
	}{
		{"let go", "", func(b *logBuilder, open time.Time) {
			at := open.Add(idle + 5*time.Second)
			b.breakerRec(key, nil, "a", 7, at, at.Add(50*time.Millisecond))
		}, time.Hour, nil, 1},
		{"kept", "breaker.shared_not_let_go", nil, time.Hour, nil, 1},
		{"reset", "", func(b *logBuilder, open time.Time) {
			at := open.Add(time.Second)
			v, err := event.EncodeBreakerState(&event.BreakerState{Scope: "PROVIDER_MODEL", Key: "openai/gpt-4o", State: "CLOSED", Reset: true,
				Reason: "checked", UpdatedAt: event.At(at), Instance: "ops"})
			if err != nil {
				t.Fatal(err)
			}
			b.breakerRec(event.BreakerResetKey("PROVIDER_MODEL", "openai/gpt-4o"), v, "ops", 99, at, at.Add(50*time.Millisecond))
		}, time.Hour, nil, 0},
		{"kept, not yet due", "", nil, idle + 15*time.Second, nil, 0},
		{"kept, adopted by a start", "", nil, idle + 30*time.Second, []time.Duration{idle}, 0},
		{"kept, started after it was due", "breaker.shared_not_let_go", nil, idle + 2*time.Minute, []time.Duration{idle + time.Minute}, 1},
		{"kept, adopted again by a start after it was due", "breaker.shared_not_let_go", func(b *logBuilder, open time.Time) {
			b.alert(event.BreakerEvent{Scope: "PROVIDER_MODEL", Key: "openai/gpt-4o", Kind: "TRANSITION", From: "CLOSED", To: "OPEN",
				Reason: "adopted from a", Instance: "b", At: event.At(open.Add(idle + time.Minute + time.Second))}, adoptedFrom("a"))
		}, idle + 2*time.Minute, []time.Duration{idle + time.Minute}, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := newLog(t)
			open := b.t0.Add(9 * time.Second)
			v, err := event.EncodeBreakerState(&event.BreakerState{Scope: "PROVIDER_MODEL", Key: "openai/gpt-4o", State: "OPEN",
				OpenedAt: ptrTo(event.At(open)), Reason: "failure ratio 0.6 over 20 requests", UpdatedAt: event.At(open), Instance: "a"})
			if err != nil {
				t.Fatal(err)
			}
			b.breakerRec(key, v, "a", 7, open, open.Add(50*time.Millisecond))
			if c.after != nil {
				c.after(b, open)
			}
			b.logs.End = open.Add(c.end)
			o := Options{Policy: policy.Default(), Ingress: "in", Decisions: "decisions", Starts: map[string][]time.Time{"b": {b.t0}}}
			for _, s := range c.starts {
				o.Starts["b"] = append(o.Starts["b"], open.Add(s))
			}
			rep, err := Check(b.logs, o)
			if err != nil {
				t.Fatal(err)
			}
			var s strings.Builder
			rep.WriteText(&s)
			switch {
			case c.check == "" && rep.ViolationsByCheck["breaker.shared_not_let_go"] != 0:
				t.Fatalf("breaker.shared_not_let_go reported:\n%s", s.String())
			case c.check != "" && rep.ViolationsByCheck[c.check] == 0:
				t.Fatalf("no %s violation; got %v\n%s", c.check, rep.ViolationsByCheck, s.String())
			case rep.IdleShared != c.idle:
				t.Fatalf("IdleShared %d, want %d\n%s", rep.IdleShared, c.idle, s.String())
			}
		})
	}
}
