package router

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/scan"
	"github.com/faultrouter/faultrouter/pkg/store"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// restore brings the Pebble cache of the given partitions up to the end of
// the state changelog, from the checkpoint offset kept in Pebble. It waits
// for open transactions on the changelog to finish first (a previous owner's
// last transaction commits or aborts), so that nothing committed is missed.
func (r *Router) restore(ctx context.Context, cl *kgo.Client, parts []int32) error {
	if len(parts) == 0 {
		return nil
	}
	topic := r.cfg.Topics.State
	entered := time.Now()
	defer func() { r.metrics.restoreSeconds.Observe(time.Since(entered).Seconds()) }()
	adm := kadm.NewClient(cl)
	ends, err := r.stableEnds(ctx, adm, topic, parts)
	if err != nil {
		return err
	}
	ranges := scan.Ranges{}
	for _, p := range parts {
		next, _, err := r.store.Checkpoint(p)
		if err != nil {
			return err
		}
		if next < ends[p] {
			ranges.Set(topic, p, scan.Range{Start: next, End: ends[p]})
		}
	}
	if len(ranges) == 0 {
		r.log.Info("state is up to date", "topic", topic, "partitions", parts)
		return nil
	}
	remaining := ranges.Len()
	r.log.Info("restoring state from the changelog", "topic", topic, "partitions", len(ranges[topic]), "records", remaining)
	r.metrics.restoreRemaining.Set(float64(remaining))

	began, lastLog := time.Now(), time.Now()
	var total int64
	err = scan.Read(ctx, r.cfg.ClientOpts, ranges, func(b *scan.Batch) error {
		wb := r.store.NewBatch()
		applied := map[string]*task.State{} // states this batch wrote: a later record of the task replaces their index entries
		for _, rec := range b.Records {
			if err := r.applyChangelog(wb, rec, applied); err != nil {
				wb.Discard()
				return err
			}
			total++
			r.metrics.restoredRecords.Inc()
		}
		for p, n := range b.Next[topic] {
			if err := wb.SetCheckpoint(p, n); err != nil {
				wb.Discard()
				return err
			}
		}
		if err := wb.Commit(); err != nil {
			return err
		}
		r.metrics.restoreRemaining.Set(float64(b.Left))
		if time.Since(lastLog) > 5*time.Second {
			r.log.Info("restoring state", "applied", total, "partitions_left", b.Partitions)
			lastLog = time.Now()
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("router: restore: %w", err)
	}
	r.metrics.restoreRemaining.Set(0)
	r.log.Info("state restored", "topic", topic, "records", total, "took", time.Since(began).Round(time.Millisecond))
	return nil
}

// applyChangelog applies one changelog record: a state, or a tombstone. The
// state it replaces is the one an earlier record of the same batch wrote
// (applied), else the store's: a task changed twice in one batch (a retry
// decided, then published) must not leave the first state's due-index entry
// behind, or stale entries pile up at the head of the due index.
func (r *Router) applyChangelog(wb *store.Batch, rec *kgo.Record, applied map[string]*task.State) error {
	id := string(rec.Key)
	old, ok := applied[id]
	if !ok {
		var err error
		if old, err = r.store.Get(id); err != nil {
			return err
		}
	}
	if rec.Value == nil {
		applied[id] = nil
		return wb.Delete(rec.Partition, old)
	}
	st, err := task.Unmarshal(rec.Value)
	if err != nil {
		r.log.Error("changelog record does not decode; skipped", "task_id", id, "partition", rec.Partition, "offset", rec.Offset, "err", err)
		return nil
	}
	applied[id] = st
	return wb.PutEncoded(rec.Partition, old, st, rec.Value)
}

// stableEnds returns the end offsets of the changelog partitions once no
// transaction is open on them (last stable offset equals high watermark),
// waiting at most the transaction timeout plus a margin.
func (r *Router) stableEnds(ctx context.Context, adm *kadm.Client, topic string, parts []int32) (map[int32]int64, error) {
	deadline := time.Now().Add(r.cfg.TransactionTimeout + 15*time.Second)
	for {
		stable, err := adm.ListCommittedOffsets(ctx, topic)
		if err != nil {
			return nil, fmt.Errorf("router: list stable offsets of %s: %w", topic, err)
		}
		hw, err := adm.ListEndOffsets(ctx, topic)
		if err != nil {
			return nil, fmt.Errorf("router: list end offsets of %s: %w", topic, err)
		}
		ends := map[int32]int64{}
		open := 0
		for _, p := range parts {
			s, ok := stable.Lookup(topic, p)
			if !ok || s.Err != nil {
				return nil, fmt.Errorf("router: stable offset of %s/%d unknown", topic, p)
			}
			h, _ := hw.Lookup(topic, p)
			ends[p] = s.Offset
			if h.Offset > s.Offset {
				open++
			}
		}
		if open == 0 || time.Now().After(deadline) {
			return ends, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
