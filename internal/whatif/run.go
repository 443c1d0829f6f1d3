package whatif

// run.go is the I/O of a what-if: it reads the committed inputs of a time
// range and their audit records (internal/replay, read_committed), replays them
// through both policies (checker.Replay) and compares (Compare). The policy
// whatif verb and the console's What-if page both run through it.

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/checker"
	"github.com/faultrouter/faultrouter/internal/replay"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// Topics are the full names of the topics a what-if reads. Retry is
// optional: without it the replay takes every retry to be published at its
// due time (a breaker's hold not seen), which moves the expiry of tasks held
// behind an open breaker.
// It reads the Ingress, Decisions, Audit and Retry fields.
type Topics = topicspec.Topics

// RunOptions are the I/O side of Run.
type RunOptions struct {
	// Idle gives up on partitions that deliver nothing for this long.
	// Default 30 s.
	Idle time.Duration
	// Progress receives one line on what was read; nil discards it.
	Progress io.Writer
}

// Run reads the task events and review decisions of the range (record
// timestamps Since <= t < Until), the audit records and the retries
// published from Since to the committed end (an input's audit record is
// written after it; a task's retries set its expiry), replays them through
// o.Baseline and o.Candidate, and compares. A caller with a candidate policy
// file loads it with policy.Load and passes it as o.Candidate.
func Run(ctx context.Context, clientOpts []kgo.Opt, t Topics, o Options, ro RunOptions) (*Report, error) {
	logs, err := Read(ctx, clientOpts, t, replay.Range{Since: o.Since, Until: o.Until}, ro.Idle)
	if err != nil {
		return nil, err
	}
	if ro.Progress != nil {
		fmt.Fprintf(ro.Progress, "policy whatif: %d task events, %d decisions-topic records in the range; %d audit records, %d retries read\n",
			len(logs.Ingress), len(logs.Decisions), len(logs.Audit), len(logs.Retry))
	}
	b, err := checker.Replay(logs, checker.Options{Policy: o.Baseline, Ingress: t.Ingress, Decisions: t.Decisions})
	if err != nil {
		return nil, err
	}
	c, err := checker.Replay(logs, checker.Options{Policy: o.Candidate, Ingress: t.Ingress, Decisions: t.Decisions})
	if err != nil {
		return nil, err
	}
	return Compare(b, c, o)
}

// Read reads the inputs of rng and, from its start to the committed end, the
// audit records of those inputs.
func Read(ctx context.Context, clientOpts []kgo.Opt, t Topics, rng replay.Range, idle time.Duration) (checker.Logs, error) {
	var logs checker.Logs
	err := replay.Each(ctx, clientOpts, []string{t.Ingress, t.Decisions}, rng, idle, nil, func(rec *kgo.Record) error {
		if rec.Topic == t.Ingress {
			logs.Ingress = append(logs.Ingress, rec)
		} else {
			logs.Decisions = append(logs.Decisions, rec)
		}
		return nil
	})
	if err != nil {
		return logs, err
	}
	// keep only the audit records of these inputs: the audit topic is read
	// to its end, which may hold far more than the range
	c, err := codec.New()
	if err != nil {
		return logs, err
	}
	type at struct {
		topic     string
		partition int32
		offset    int64
	}
	inputs := make(map[at]bool, len(logs.Ingress)+len(logs.Decisions))
	for _, recs := range [][]*kgo.Record{logs.Ingress, logs.Decisions} {
		for _, r := range recs {
			inputs[at{r.Topic, r.Partition, r.Offset}] = true
		}
	}
	tasks := map[string]bool{}
	for _, recs := range [][]*kgo.Record{logs.Ingress, logs.Decisions} {
		for _, r := range recs {
			tasks[string(r.Key)] = true
		}
	}
	topics := []string{t.Audit}
	if t.Retry != "" {
		topics = append(topics, t.Retry)
	}
	err = replay.Each(ctx, clientOpts, topics, replay.Range{Since: rng.Since}, idle, nil, func(rec *kgo.Record) error {
		if rec.Topic == t.Retry {
			if tasks[string(rec.Key)] { // the retries of the range's tasks: their expiry
				logs.Retry = append(logs.Retry, rec)
			}
			return nil
		}
		r, err := c.DecodeRouted(rec.Value)
		if err != nil || inputs[at{r.Input.Topic, r.Input.Partition, r.Input.Offset}] {
			logs.Audit = append(logs.Audit, rec) // an undecodable one too: the replay reports it
		}
		return nil
	})
	logs.End = time.Now()
	return logs, err
}
