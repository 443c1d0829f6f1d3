package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/ledger"
	"github.com/faultrouter/faultrouter/internal/replay"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

const costSynopsis = `usage: faultrouter cost --since T [--until T] [--format table|json] [--policy FILE] [--top N]

Spend and cost prevented over a time range of the audit topic (read_committed):
the reported usage of every attempt the router decided, each attempt once
(an exact redelivery, a record forwarded to its task's partition, a
re-drive and a redelivery after the task's TTL are the same attempt again),
by class, provider/model, prompt template and review owner, failed (not
SUCCEEDED) versus succeeded, and the cost prevented: for each task the
router stopped (a refusal or schema violation to review, a dead letter, a
budget stop, a write whose outcome is unknown held), the attempts a blind
baseline that retries every failure cost_prevented.baseline_retries times
(default 3) would still have made after the task's last attempt (attempts
made after a stop are netted off), times that task's mean attempt cost, as
the router wrote it on the audit records. --policy names the policy file
whose baseline to use for audit records of builds that wrote none (default:
the built-in policy).

--since and --until are RFC 3339 or relative (-24h, -7d); the range holds
the audit records written at or after --since and before --until.`

func costCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, g := newFlagSet("cost", costSynopsis, stderr)
	since := fs.String("since", "", "start of the range: RFC 3339 or relative like -24h (required)")
	until := fs.String("until", "", "end of the range, exclusive (default: now)")
	format := fs.String("format", "table", "output: table or json")
	file := fs.String("policy", "", "policy file whose cost_prevented baseline to use (default: the built-in policy)")
	top := fs.Int("top", 10, "table: rows per section, the rest summed in one line (0: all)")
	idle := fs.Duration("idle", 30*time.Second, "give up on partitions that deliver nothing for this long")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("cost: unexpected argument %q", fs.Arg(0))
	case *since == "":
		return errors.New("cost: --since is required (RFC 3339 or relative like -24h)")
	case *format != "table" && *format != "json":
		return fmt.Errorf("cost: --format %q: allowed table, json", *format)
	case *top < 0:
		return fmt.Errorf("cost: --top %d: at least 0", *top)
	}
	rng, err := timeRange("cost", *since, *until, time.Now())
	if err != nil {
		return err
	}
	p := policy.Default()
	if *file != "" {
		if p, err = loadPolicy(*file); err != nil {
			return err
		}
	}
	audit, err := g.topicName(topicspec.Audit)
	if err != nil {
		return err
	}
	opts, err := g.clientOpts(nil)
	if err != nil {
		return err
	}
	if err := g.requireTopics(ctx, "cost", opts, audit); err != nil {
		return err
	}
	rep, err := costReport(ctx, opts, audit, rng, p, *idle, stderr)
	if err != nil {
		return ctxErr(ctx, err)
	}
	return writeCost(stdout, rep, rng, *format, *top)
}

// timeRange parses --since and --until; the end defaults to now.
func timeRange(verb, since, until string, now time.Time) (replay.Range, error) {
	var r replay.Range
	var err error
	if r.Since, err = replay.ParseTime(since, now); err != nil {
		return r, fmt.Errorf("%s: --since: %w", verb, err)
	}
	r.Until = now
	if until != "" {
		if r.Until, err = replay.ParseTime(until, now); err != nil {
			return r, fmt.Errorf("%s: --until: %w", verb, err)
		}
	}
	if !r.Since.Before(r.Until) {
		return r, fmt.Errorf("%s: --since %s is not before --until %s", verb, r.Since.UTC().Format(time.RFC3339), r.Until.UTC().Format(time.RFC3339))
	}
	return r, nil
}

// costReport sums the ledger over the audit records of the range.
func costReport(ctx context.Context, opts []kgo.Opt, audit string, rng replay.Range, p *policy.Policy, idle time.Duration, stderr io.Writer) (ledger.Report, error) {
	c, err := codec.New()
	if err != nil {
		return ledger.Report{}, err
	}
	l := ledger.New(p)
	undecodable, read := 0, 0
	err = replay.Each(ctx, opts, []string{audit}, rng, idle, nil, func(rec *kgo.Record) error {
		read++
		r, err := c.DecodeRouted(rec.Value)
		if err != nil {
			undecodable++
			return nil
		}
		l.Add(r.Event, &r.Decision, ledger.RepeatOf(&r.Decision, rec.Headers))
		return nil
	})
	fmt.Fprintf(stderr, "cost: %d audit records in the range\n", read)
	if undecodable > 0 {
		fmt.Fprintf(stderr, "cost: %d audit record(s) did not decode and are not counted\n", undecodable)
	}
	return l.Report(), err
}

// costJSON is the JSON form of `faultrouter cost`.
type costJSON struct {
	Since string `json:"since"`
	Until string `json:"until"`
	ledger.Report
}

func writeCost(w io.Writer, rep ledger.Report, rng replay.Range, format string, top int) error {
	if format == "json" {
		b, err := json.MarshalIndent(costJSON{Since: rng.Since.UTC().Format(time.RFC3339Nano), Until: rng.Until.UTC().Format(time.RFC3339Nano), Report: rep}, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	fmt.Fprintf(w, "from %s to %s\n", rng.Since.UTC().Format(time.RFC3339), rng.Until.UTC().Format(time.RFC3339))
	return rep.WriteTable(w, top)
}
