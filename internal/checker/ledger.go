package checker

import (
	"fmt"

	"github.com/faultrouter/faultrouter/internal/ledger"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// checkPrevented checks the cost prevented an audit record carries: the
// policy's for the model's decision (none for a decision that is no stop).
// An audit record of RoutedRecord version 1 (an earlier build's, during an
// upgrade) carries none and is not checked; the ledger check still counts
// its stops, computed with the policy.
func (c *checker) checkPrevented(task string, in *input, got, want *event.Decision) {
	if _, v, err := c.codec.WriterVersion(in.audit.rec.Value); err == nil && v < 2 {
		return // written by a build before RoutedRecord version 2, which had no prevented
	}
	w := c.o.Policy.PreventedRecord(want)
	g := got.Prevented
	switch {
	case g == nil && w == nil:
	case g == nil || w == nil || *g != *w:
		c.violate("audit.prevented", task, "input %s: the audit record carries cost prevented %s, want %s", in.key, preventedText(g), preventedText(w))
	}
}

func preventedText(p *event.Prevented) string {
	if p == nil {
		return "none"
	}
	return fmt.Sprintf("%s: %d baseline attempts, %s (baseline %d retries)", p.Stop, p.Attempts, ledger.Dollars(p.USD), p.BaselineRetries)
}

// checkLedger checks the cost ledger: the sums `faultrouter cost` computes
// from the audit records (their events' usage and their decisions) equal
// the sums of the model's decisions of the input events, in total (spend,
// failed spend, cost prevented) and per class.
func (c *checker) checkLedger() {
	model, audit := ledger.New(c.o.Policy), ledger.New(c.o.Policy)
	for _, in := range c.inputs {
		if in.kind != inTask || in.audit == nil || in.decided.Route == "" {
			continue
		}
		model.Add(&in.event, &in.decided)
		audit.Add(in.audit.r.Event, &in.audit.r.Decision)
	}
	m, a := model.Report(), audit.Report()
	c.rep.Ledger = &LedgerSums{SpendUSD: m.TotalUSD, FailedUSD: m.FailedUSD, PreventedUSD: m.PreventedUSD}
	for _, x := range []struct {
		name      string
		got, want float64
	}{{"spend", a.TotalUSD, m.TotalUSD}, {"failed spend", a.FailedUSD, m.FailedUSD}, {"cost prevented", a.PreventedUSD, m.PreventedUSD}} {
		if ledger.Micros(x.got) != ledger.Micros(x.want) {
			c.violate("ledger.total", "", "the audit records sum to %s of %s, the model's decisions to %s", ledger.Dollars(x.got), x.name, ledger.Dollars(x.want))
		}
	}
	want := map[string]ledger.Row{}
	for _, r := range m.Classes {
		want[r.Key] = r
	}
	for _, r := range a.Classes {
		w := want[r.Key]
		delete(want, r.Key)
		if r.Attempts != w.Attempts || ledger.Micros(r.CostUSD) != ledger.Micros(w.CostUSD) || ledger.Micros(r.PreventedUSD) != ledger.Micros(w.PreventedUSD) {
			c.violate("ledger.class", "", "class %s: the audit records sum to %d attempts, %s, %s prevented; the model's decisions to %d, %s, %s",
				r.Key, r.Attempts, ledger.Dollars(r.CostUSD), ledger.Dollars(r.PreventedUSD), w.Attempts, ledger.Dollars(w.CostUSD), ledger.Dollars(w.PreventedUSD))
		}
	}
	for k, w := range want {
		c.violate("ledger.class", "", "class %s: the model's decisions sum to %d attempts, %s; the audit records to none", k, w.Attempts, ledger.Dollars(w.CostUSD))
	}
}

// LedgerSums are the cost ledger's totals of the model's decisions.
type LedgerSums struct {
	SpendUSD, FailedUSD, PreventedUSD float64
}

func (l *LedgerSums) String() string {
	return fmt.Sprintf("spend %s (failed %s), cost prevented %s", ledger.Dollars(l.SpendUSD), ledger.Dollars(l.FailedUSD), ledger.Dollars(l.PreventedUSD))
}
