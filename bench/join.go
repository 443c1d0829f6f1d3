package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/router"
	"github.com/faultrouter/faultrouter/internal/scan"
)

// joinResult is what a rebalance under load costs: a second instance joins
// the group of a router that routes at half its maximum rate, and each
// restores what it must. The instance that stays restores, for the
// partitions it keeps, only what its own batch in flight at the revoke
// committed after it; the joiner starts from an empty state directory and
// restores the partitions that moved to it, from the changelog's start: the
// moved partitions' changelog records are the reference.
type joinResult struct {
	Rate float64 `json:"events_per_s"`
	// RestoredFirst is what the first instance restored after the join,
	// RestoredJoiner what the joiner restored.
	RestoredFirst  float64 `json:"restored_by_first"`
	RestoredJoiner float64 `json:"restored_by_joiner"`
	// FirstRestores counts the restores the first instance ran after the
	// join (one for each assignment it was given, none when it kept its
	// partitions through the rebalance).
	FirstRestores int     `json:"restores_by_first"`
	Moved         []int32 `json:"moved_partitions"`
	// MovedRecords are the committed changelog records of the moved
	// partitions when the joiner was ready, ChangelogRecords those of every
	// partition.
	MovedRecords     int     `json:"moved_changelog_records"`
	ChangelogRecords int     `json:"changelog_records"`
	RestoredOverMove float64 `json:"restored_over_moved"`
	JoinerReadyS     float64 `json:"joiner_start_to_ready_s"`
	// Behind says that the two instances had not caught up with the input
	// 30 s after the run; the restores were counted all the same.
	Behind bool `json:"behind,omitempty"`
}

// joinerClientID names the joiner's client in the group's description.
const joinerClientID = "faultrouter-bench-joiner"

// joinAtHalfLoad produces fresh tasks at rate for d, from task first on,
// and a third into the run starts a second instance (an empty state
// directory) in rt's group. It returns the result and the joiner, which the
// caller stops with rt.
func joinAtHalfLoad(ctx context.Context, out io.Writer, c config, seeds []kgo.Opt, topics router.Topics, w *workload,
	rt *runningRouter, group string, first int, rate float64, d time.Duration) (joinResult, *runningRouter, error) {
	res := joinResult{Rate: rate}
	before := rt.counter("faultrouter_restore_records_total")
	restoresBefore := rt.observations("faultrouter_restore_seconds")
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	produced := make(chan error, 1)
	go func() { produced <- produceAt(pctx, seeds, w, first, rate, d) }()

	select {
	case <-time.After(d / 3):
	case err := <-produced:
		return res, nil, err
	case <-ctx.Done():
		return res, nil, ctx.Err()
	}
	dir, err := tempDir(c.workDir, "state-joiner")
	if err != nil {
		return res, nil, err
	}
	opts := append(append([]kgo.Opt{}, seeds...), kgo.ClientID(joinerClientID))
	joiner, ready, err := startInstance(ctx, opts, topics, group, "bench-joiner", dir, c.tune)
	if err != nil {
		return res, nil, fmt.Errorf("joiner: %w", err)
	}
	res.JoinerReadyS = ready.Seconds()
	// the changelog as the joiner restored it: up to its stable end
	cl, err := kgo.NewClient(seeds...)
	if err != nil {
		return res, joiner, err
	}
	ranges, err := scan.Committed(ctx, kadm.NewClient(cl), topics.State)
	cl.Close()
	if err != nil {
		return res, joiner, err
	}
	fmt.Fprintf(out, "   joiner ready after %s\n", ready.Round(time.Millisecond))
	if err := <-produced; err != nil {
		return res, joiner, err
	}

	// both caught up: the first instance's restore after the join is over
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	for _, r := range []*runningRouter{rt, joiner} {
		if err := r.waitCaughtUp(wctx); errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			res.Behind = true
		} else if err != nil {
			return res, joiner, err
		}
	}
	res.RestoredFirst = rt.counter("faultrouter_restore_records_total") - before
	res.FirstRestores = int(rt.observations("faultrouter_restore_seconds") - restoresBefore)
	res.RestoredJoiner = joiner.counter("faultrouter_restore_records_total")

	if res.Moved, err = joinerPartitions(ctx, seeds, group, topics.Ingress); err != nil {
		return res, joiner, err
	}
	perPartition := map[int32]int{}
	err = scan.Read(ctx, seeds, ranges, func(b *scan.Batch) error {
		for _, r := range b.Records {
			perPartition[r.Partition]++
		}
		return nil
	})
	if err != nil {
		return res, joiner, err
	}
	for p, n := range perPartition {
		res.ChangelogRecords += n
		if slices.Contains(res.Moved, p) {
			res.MovedRecords += n
		}
	}
	if res.MovedRecords > 0 {
		res.RestoredOverMove = res.RestoredJoiner / float64(res.MovedRecords)
	}
	return res, joiner, nil
}

// joinerPartitions returns the partitions of topic the group assigned to
// the joiner (state partition p goes with input partition p).
func joinerPartitions(ctx context.Context, seeds []kgo.Opt, group, topic string) ([]int32, error) {
	cl, err := kgo.NewClient(seeds...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	groups, err := kadm.NewClient(cl).DescribeGroups(ctx, group)
	if err != nil {
		return nil, err
	}
	g, ok := groups[group]
	if !ok || g.Err != nil {
		return nil, fmt.Errorf("describe group %s: %v", group, g.Err)
	}
	var parts []int32
	for _, m := range g.Members {
		if m.ClientID != joinerClientID {
			continue
		}
		a, ok := m.Assigned.AsConsumer()
		if !ok {
			return nil, fmt.Errorf("group %s: the joiner's assignment is not a consumer's", group)
		}
		for _, t := range a.Topics {
			if t.Topic == topic {
				parts = append(parts, t.Partitions...)
			}
		}
	}
	slices.Sort(parts)
	return parts, nil
}

// produceAt produces the first attempts of fresh tasks, from task first on,
// at a steady rate for d.
func produceAt(ctx context.Context, seeds []kgo.Opt, w *workload, first int, rate float64, d time.Duration) error {
	prod, err := kgo.NewClient(append(append([]kgo.Opt{}, seeds...), kgo.ProducerLinger(0))...)
	if err != nil {
		return err
	}
	defer prod.Close()
	var (
		mu      sync.Mutex
		perr    error
		sent    int
		total   = int(rate * d.Seconds())
		t0      = time.Now()
		tick    = time.NewTicker(5 * time.Millisecond)
		promise = func(_ *kgo.Record, err error) {
			if err != nil {
				mu.Lock()
				perr = err
				mu.Unlock()
			}
		}
	)
	defer tick.Stop()
	for sent < total {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		for due := min(total, int(rate*time.Since(t0).Seconds())); sent < due; sent++ {
			rec, err := w.record(first+sent, 1, time.Now())
			if err != nil {
				return err
			}
			rec.Timestamp = time.Now()
			prod.Produce(ctx, rec, promise)
		}
	}
	if err := prod.Flush(ctx); err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	return perr
}
