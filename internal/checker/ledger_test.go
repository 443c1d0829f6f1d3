package checker

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/event"
)

// Guards the checker's ledger check: a correct router's audit records sum to
// the model's spend and cost prevented (two timeouts and a refusal at $0.01
// each: $0.03, and the refusal stops the task one attempt short of the
// baseline's four: $0.01 prevented); an audit record whose event reports
// another cost than the input is a ledger violation; an audit record of a
// stop must carry the cost it prevented.
func TestCheckLedger(t *testing.T) {
	rep := run(t, func(b *logBuilder, d []event.Decision, in []*kgo.Record, ev []event.TaskEvent) {
		correct(b, d, in, ev, "")
	})
	if !rep.OK() || rep.Ledger == nil || rep.Ledger.SpendUSD != 0.03 || rep.Ledger.FailedUSD != 0.03 || rep.Ledger.PreventedUSD != 0.01 {
		t.Fatalf("correct outputs: ok %v, ledger %+v; want spend $0.03, all failed, $0.01 prevented", rep.OK(), rep.Ledger)
	}
	rep = run(t, func(b *logBuilder, d []event.Decision, in []*kgo.Record, ev []event.TaskEvent) {
		b.routed("audit", in[0], &ev[0], audited(d[0]))
		other := ev[1]
		other.Usage.CostUSD = 0.5
		b.routed("audit", in[1], &other, audited(d[1]))
		b.routed("audit", in[2], &ev[2], audited(d[2]))
		for i := range d {
			if d[i].Route == event.RouteRetry {
				due := d[i]
				due.DecidedAt = d[i].Retry.NotBefore
				b.routed("retry", nil, &ev[i], due)
			}
			if d[i].Route == event.RouteReview {
				b.routed("review", in[i], &ev[i], d[i])
			}
		}
	})
	if rep.ViolationsByCheck["ledger.total"] == 0 || rep.ViolationsByCheck["ledger.class"] == 0 {
		t.Fatalf("an audit record with another cost: violations %v, want ledger.total and ledger.class", rep.ViolationsByCheck)
	}
	// the refusal's audit record without the cost it prevented
	rep = run(t, func(b *logBuilder, d []event.Decision, in []*kgo.Record, ev []event.TaskEvent) {
		correct(b, d[:2], in[:2], ev[:2], "")
		b.routed("audit", in[2], &ev[2], d[2])
		b.routed("review", in[2], &ev[2], d[2])
	})
	if rep.ViolationsByCheck["audit.prevented"] != 1 {
		t.Fatalf("an audit record of a stop without its cost prevented: violations %v, want audit.prevented", rep.ViolationsByCheck)
	}
}
