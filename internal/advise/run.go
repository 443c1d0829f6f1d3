package advise

// run.go is the I/O of the advisor: it reads the task events and review
// decisions of a range with their audit records (whatif.Read), puts them in
// the order the router decided them (checker.Replay with the running
// policy; the analysis uses the decisions the audit recorded), analyses
// them, writes the candidate and runs its what-if against the running
// policy (whatif.Run). The policy advise verb and the console's Advise page
// both run through it.

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/checker"
	"github.com/faultrouter/faultrouter/internal/replay"
	"github.com/faultrouter/faultrouter/internal/whatif"
	"github.com/faultrouter/faultrouter/pkg/policy"
)

// RunOptions are the I/O side of Run.
type RunOptions struct {
	// Since and Until are the range: inputs with record timestamps
	// Since <= t < Until. Required.
	Since, Until time.Time
	// RunningFile is the running policy's file, the base of the candidate;
	// nil or empty for the built-in policy.
	RunningFile []byte
	// Idle gives up on partitions that deliver nothing for this long.
	// Default 30 s.
	Idle time.Duration
	// Progress receives a line on what was read; nil discards it.
	Progress io.Writer
}

// Result is an advisor's run.
type Result struct {
	Since, Until time.Time
	*Report
	// Candidate is the running policy file with the proposals written in
	// (Candidate); nil when nothing is proposed.
	Candidate []byte
	// Whatif is the candidate's what-if against the running policy; nil
	// when nothing is proposed or WhatifError says why it could not run.
	Whatif      *whatif.Report
	WhatifError string
}

// Run reads the range, analyses it with o (o.Policy is the running policy)
// and, when it proposes anything, writes the candidate and runs its
// what-if.
func Run(ctx context.Context, clientOpts []kgo.Opt, t whatif.Topics, o Options, ro RunOptions) (*Result, error) {
	if o.Policy == nil {
		return nil, fmt.Errorf("advise: Options.Policy (the running policy) is required")
	}
	logs, err := whatif.Read(ctx, clientOpts, t, replay.Range{Since: ro.Since, Until: ro.Until}, ro.Idle)
	if err != nil {
		return nil, err
	}
	if ro.Progress != nil {
		fmt.Fprintf(ro.Progress, "policy advise: %d task events, %d decisions-topic records in the range; %d audit records read\n",
			len(logs.Ingress), len(logs.Decisions), len(logs.Audit))
	}
	decided, err := checker.Replay(logs, checker.Options{Policy: o.Policy, Ingress: t.Ingress, Decisions: t.Decisions})
	if err != nil {
		return nil, err
	}
	res := &Result{Since: ro.Since, Until: ro.Until, Report: Analyze(Inputs(decided), o)}
	if len(res.Proposals) == 0 {
		return res, nil
	}
	if res.Candidate, err = Candidate(ro.RunningFile, res.Proposals); err != nil {
		return nil, err
	}
	cand, err := policy.Parse(res.Candidate)
	if err != nil {
		res.WhatifError = "the candidate does not load: " + err.Error()
		return res, nil
	}
	res.Whatif, err = whatif.Run(ctx, clientOpts, t, whatif.Options{Baseline: o.Policy, Candidate: cand, Since: ro.Since, Until: ro.Until},
		whatif.RunOptions{Idle: ro.Idle})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// Inputs are the replayed inputs that have an audit record, with the
// decision it recorded.
func Inputs(decided []checker.Decided) []Input {
	out := make([]Input, 0, len(decided))
	for i := range decided {
		d := &decided[i]
		if !d.Audited {
			continue
		}
		out = append(out, Input{Task: d.Task, Event: d.Event, Review: d.Review, Decision: d.Recorded})
	}
	return out
}
