package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/faultrouter/faultrouter/internal/advise"
	"github.com/faultrouter/faultrouter/internal/whatif"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

const adviseSynopsis = `usage: faultrouter policy advise --since T [--until T] [--policy RUNNING.yaml] [--out CANDIDATE.yaml] [--format table|json]

Reads what the router decided over a time range (the task events and review
decisions of the range, with their audit records) and what reviewers then
did, and proposes the policy changes the data supports:

  max_retries    of a class, lowered for a provider, model, action or prompt
                 template whose retry N succeeds so rarely that even the 95%
                 interval's upper bound is under 15% (lowered to N-1); raised
                 by one where every retry succeeds at least half the time and
                 tasks still run out of them
  min_confidence of model_refusal, lowered for a provider/model to the lowest
                 confidence band (0.05 wide, walking down from the current
                 value) whose refusals reviewers approve (the interval's lower
                 bound at least 70%)
  sla_ms         of a review owner, raised to the 90th percentile of how long
                 its items really wait, when most of them miss the SLA

Every proposal states its evidence: the counts and a 95% interval (Wilson
for rates; order statistics for the median wait). None rests on fewer than
--min-count observations, so a handful of events proposes nothing.

The proposals are written as a candidate policy: the running policy file
(--policy; default the built-in policy) with an entry of "overrides" per
provider/model change and the owners' new SLAs in "owners". --out writes it
to a file (else it is printed). Below the proposals comes the candidate's
what-if against the running policy, as policy whatif computes it: retries,
attempts stopped and added, net cost, review items per owner.

Try it:
  faultrouter policy advise --since -7d --out candidate.yaml
  faultrouter policy check candidate.yaml
  faultrouter policy whatif --policy candidate.yaml --since -7d

--since and --until are RFC 3339 or relative (-24h, -7d). Waits are measured
on the stream's clocks: from the occurred_at of the attempt that opened the
item to the reviewer's decision time.`

func adviseCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, g := newFlagSet("policy advise", adviseSynopsis, stderr)
	since := fs.String("since", "", "start of the range: RFC 3339 or relative like -7d (required)")
	until := fs.String("until", "", "end of the range, exclusive (default: now)")
	file := fs.String("policy", "", "the policy the router runs with (default: the built-in policy)")
	out := fs.String("out", "", "write the candidate policy to this file (default: print it)")
	format := fs.String("format", "table", "output: table or json")
	minCount := fs.Int("min-count", 30, "the fewest observations a proposal rests on")
	idle := fs.Duration("idle", 30*time.Second, "give up on partitions that deliver nothing for this long")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("policy advise: unexpected argument %q", fs.Arg(0))
	case *since == "":
		return errors.New("policy advise: --since is required (RFC 3339 or relative like -7d)")
	case *format != "table" && *format != "json":
		return fmt.Errorf("policy advise: --format %q: allowed table, json", *format)
	case *minCount < 1:
		return fmt.Errorf("policy advise: --min-count %d: at least 1", *minCount)
	}
	rng, err := timeRange("policy advise", *since, *until, time.Now())
	if err != nil {
		return err
	}
	running := policy.Default()
	var runningFile []byte
	if *file != "" {
		if runningFile, err = os.ReadFile(*file); err != nil {
			return fmt.Errorf("policy advise: --policy: %w", err)
		}
		if running, err = policy.ParseFile(*file, runningFile); err != nil {
			return err
		}
	}
	set, err := g.topics()
	if err != nil {
		return err
	}
	var t whatif.Topics
	for _, x := range []struct {
		short topicspec.Short
		name  *string
	}{{topicspec.Ingress, &t.Ingress}, {topicspec.Decisions, &t.Decisions}, {topicspec.Audit, &t.Audit}, {topicspec.Retry, &t.Retry}} {
		if *x.name, err = set.Name(x.short); err != nil {
			return err
		}
	}
	opts, err := g.clientOpts(nil)
	if err != nil {
		return err
	}
	if err := g.requireTopics(ctx, "policy advise", opts, t.Ingress, t.Decisions, t.Audit, t.Retry); err != nil {
		return err
	}
	res, err := advise.Run(ctx, opts, t, advise.Options{Policy: running, MinCount: *minCount},
		advise.RunOptions{Since: rng.Since, Until: rng.Until, RunningFile: runningFile, Idle: *idle, Progress: stderr})
	if err != nil {
		return ctxErr(ctx, err)
	}
	written := ""
	if *out != "" && res.Candidate != nil {
		if err := os.WriteFile(*out, res.Candidate, 0o644); err != nil {
			return fmt.Errorf("policy advise: --out: %w", err)
		}
		written = *out
	} else if *out != "" {
		fmt.Fprintf(stderr, "policy advise: nothing proposed; %s not written\n", *out)
	}
	if *format == "json" {
		return res.WriteJSON(stdout, written)
	}
	return res.WriteTable(stdout, written)
}
