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
// bound before a person reset it. A latched breaker is never let go.
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
