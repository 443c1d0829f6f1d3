package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/replay"
	"github.com/faultrouter/faultrouter/internal/whatif"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

const whatifSynopsis = `usage: faultrouter policy whatif --policy CANDIDATE.yaml [--baseline CURRENT.yaml] --since T [--until T] [--format table|json|csv]

Replays the committed task events and review decisions of a time range, task
by task in the order the router decided them, through the baseline policy
(default: the built-in policy) and the candidate, with the router's own
decision code, and reports what the candidate would have changed:

  disagreements  the baseline replayed vs the decisions the router recorded in
                 the audit topic, printed first; non-zero means the what-if
                 cannot be trusted for those tasks, and says why (a baseline
                 that is not the policy that ran, a range that starts inside
                 a task's life, a task state that expired in one and not in
                 the other)
  changed        decisions whose class, route, rule, retry delay, review
                 owner or priority differ
  matrix         per class, baseline route -> candidate route, with counts
                 and example task IDs of every changed cell
  routes, retries added and removed, review load per owner (per day)
  cost           of the attempts the candidate stops (observed) and adds
                 (estimated from the observed mean attempt cost)

Task states expire as the router's do: 2 x SLA after a task's last decision
or the publication of its pending retry, read from the retry topic.

--format csv prints the changed decisions, one a line. What a worker would
have done after a changed decision is unknown; the limits, each with how many
decisions of the range it could touch, are printed with every table and JSON
report.`

func whatifCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, g := newFlagSet("policy whatif", whatifSynopsis, stderr)
	cand := fs.String("policy", "", "the candidate policy file (required)")
	base := fs.String("baseline", "", "the policy the router ran with (default: the built-in policy)")
	since := fs.String("since", "", "start of the range: RFC 3339 or relative like -7d (required)")
	until := fs.String("until", "", "end of the range, exclusive (default: now)")
	format := fs.String("format", "table", "output: table, json or csv (the changed decisions)")
	examples := fs.Int("examples", 3, "example task IDs per changed cell of the matrix")
	idle := fs.Duration("idle", 30*time.Second, "give up on partitions that deliver nothing for this long")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("policy whatif: unexpected argument %q", fs.Arg(0))
	case *cand == "":
		return errors.New("policy whatif: --policy CANDIDATE.yaml is required")
	case *since == "":
		return errors.New("policy whatif: --since is required (RFC 3339 or relative like -7d)")
	case *format != "table" && *format != "json" && *format != "csv":
		return fmt.Errorf("policy whatif: --format %q: allowed table, json, csv", *format)
	case *examples < 1:
		return fmt.Errorf("policy whatif: --examples %d: at least 1", *examples)
	}
	rng, err := timeRange("policy whatif", *since, *until, time.Now())
	if err != nil {
		return err
	}
	candidate, err := loadPolicy(*cand)
	if err != nil {
		return err
	}
	baseline := policy.Default()
	if *base != "" {
		if baseline, err = loadPolicy(*base); err != nil {
			return err
		}
	}
	set, err := g.topics()
	if err != nil {
		return err
	}
	names := map[topicspec.Short]string{}
	for _, s := range []topicspec.Short{topicspec.Ingress, topicspec.Decisions, topicspec.Audit, topicspec.Retry} {
		if names[s], err = set.Name(s); err != nil {
			return err
		}
	}
	opts, err := g.clientOpts(nil)
	if err != nil {
		return err
	}
	if err := g.requireTopics(ctx, "policy whatif", opts, names[topicspec.Ingress], names[topicspec.Decisions], names[topicspec.Audit], names[topicspec.Retry]); err != nil {
		return err
	}
	rep, err := runWhatif(ctx, opts, names, rng, baseline, candidate, *examples, *idle, stderr)
	if err != nil {
		return ctxErr(ctx, err)
	}
	switch *format {
	case "json":
		return rep.WriteJSON(stdout)
	case "csv":
		return rep.WriteCSV(stdout)
	}
	return rep.WriteTable(stdout)
}

// runWhatif reads the range and replays it through both policies.
func runWhatif(ctx context.Context, opts []kgo.Opt, names map[topicspec.Short]string, rng replay.Range, baseline, candidate *policy.Policy,
	examples int, idle time.Duration, stderr io.Writer) (*whatif.Report, error) {
	return whatif.Run(ctx, opts, whatif.Topics{Ingress: names[topicspec.Ingress], Decisions: names[topicspec.Decisions], Audit: names[topicspec.Audit], Retry: names[topicspec.Retry]},
		whatif.Options{Baseline: baseline, Candidate: candidate, Since: rng.Since, Until: rng.Until, Examples: examples},
		whatif.RunOptions{Idle: idle, Progress: stderr})
}
