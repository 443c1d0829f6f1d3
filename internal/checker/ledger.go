package checker

import (
	"fmt"

	"github.com/faultrouter/faultrouter/internal/ledger"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
)

// checkPrevented checks the cost prevented an audit record carries: the
// claim of the model's decision (policy.Claim: the change of the task's
// standing; none for a decision that is no stop and changes nothing). An
// audit record of RoutedRecord version 1 (an earlier build's, during an
// upgrade) carries none and is not checked; nor is one of a run that mixes
// in the previous release, which claimed per stop.
func (c *checker) checkPrevented(task string, in *input, got, want *event.Decision) {
	if c.o.MixedReleases {
		return
	}
	if _, v, err := c.codec.WriterVersion(in.audit.rec.Value); err == nil && v < 2 {
		return // written by a build before RoutedRecord version 2, which had no prevented
	}
	w, g := want.Prevented, got.Prevented
	switch {
	case g == nil && w == nil:
	case g == nil || w == nil || *g != *w:
		c.violate("audit.prevented", task, "input %s: the audit record carries cost prevented %s, want %s", in.key, preventedText(g), preventedText(w))
	}
}

// checkRepeat checks that the audit record of a task event says, in its
// faultrouter.attempt.repeat header, whether its attempt was already
// counted, as the model finds (a forward, a re-drive, a redelivery after
// the TTL; policy.RepeatOf).
func (c *checker) checkRepeat(task string, in *input) {
	if c.o.MixedReleases || in.audit == nil {
		return
	}
	got := ""
	for _, h := range in.audit.rec.Headers {
		if h.Key == codec.HeaderRepeat {
			got = string(h.Value)
		}
	}
	if got != string(in.repeat) {
		c.violate("audit.repeat", task, "input %s: the audit record names the attempt a repeat %q, want %q", in.key, got, in.repeat)
	}
}

func preventedText(p *event.Prevented) string {
	if p == nil {
		return "none"
	}
	return fmt.Sprintf("%s: %d baseline attempts, %s (baseline %d retries)", p.Stop, p.Attempts, ledger.Dollars(p.USD), p.BaselineRetries)
}

// checkLedger checks the cost ledger: the sums `faultrouter cost` computes
// from every audit record (each decoded one, whatever its input: a
// forward, a poison record, a duplicate audit record) equal the sums of the
// model's decisions of every input, in total (attempts, spend, failed
// spend, cost prevented) and per class. Not checked in a run that mixes in
// the previous release (Options.MixedReleases).
func (c *checker) checkLedger() {
	model, audit := ledger.New(c.o.Policy), ledger.New(c.o.Policy)
	for _, rec := range c.logs.Audit {
		r, err := c.codec.DecodeRouted(rec.Value)
		if err != nil {
			continue // audit.undecodable
		}
		audit.Add(r.Event, &r.Decision, ledger.RepeatOf(&r.Decision, rec.Headers))
	}
	for _, in := range c.inputs {
		if in.audit == nil || in.decided.Route == "" {
			continue // audit.missing
		}
		var ev *event.TaskEvent
		switch {
		case in.kind == inTask || in.kind == inUnwritable:
			ev = &in.event
		case in.kind == inForward && in.repeat == policy.RepeatForwarded:
			ev = &in.event
		}
		model.Add(ev, &in.decided, in.repeat)
	}
	m, a := model.Report(), audit.Report()
	c.rep.Ledger = &LedgerSums{Attempts: m.Attempts, SpendUSD: m.TotalUSD, FailedUSD: m.FailedUSD, PreventedUSD: m.PreventedUSD}
	if c.o.MixedReleases {
		return
	}
	if a.Attempts != m.Attempts {
		c.violate("ledger.total", "", "the audit records sum to %d attempts, the model's decisions to %d", a.Attempts, m.Attempts)
	}
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
	Attempts                          int64
	SpendUSD, FailedUSD, PreventedUSD float64
}

func (l *LedgerSums) String() string {
	return fmt.Sprintf("%d attempts, spend %s (failed %s), cost prevented %s", l.Attempts, ledger.Dollars(l.SpendUSD), ledger.Dollars(l.FailedUSD), ledger.Dollars(l.PreventedUSD))
}
