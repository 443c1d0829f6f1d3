package router

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/scan"
	"github.com/faultrouter/faultrouter/pkg/store"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// restoreSlice is how many writes a restore commits to Pebble at once.
const restoreSlice = 20_000

// restoreMemo bounds how many tasks' index entries a restore remembers.
const restoreMemo = 200_000

// indexOf is the part of a state that names its store index entries: what
// store.Batch needs of the state a write replaces.
func indexOf(st *task.State) *task.State {
	x := &task.State{TaskID: st.TaskID, ExpiresAt: st.ExpiresAt,
		Review: st.Review, ReviewDueAt: st.ReviewDueAt, ReviewAlerted: st.ReviewAlerted}
	if st.Pending != nil {
		p := *st.Pending
		x.Pending = &p
	}
	return x
}

// restore brings the Pebble cache of the given partitions up to the end of
// the state changelog, from the checkpoint offset kept in Pebble. It waits
// for open transactions on the changelog to finish first (a previous owner's
// last transaction commits or aborts), so that nothing committed is missed.
//
// The local state of a partition is kept only if this instance released the
// partition cleanly and the changelog has not moved since (trustOrWipe);
// else it is wiped and the partition restored from the changelog's start.
// Restoring from the checkpoint alone would keep state the changelog no
// longer holds: while another instance owned the partition it may have
// finished a task, and compaction may have dropped the task's records and
// then its tombstone, so that no record after the checkpoint says the local
// copy (a pending retry, an open review item) is gone.
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
		if err := r.trustOrWipe(p, ends[p]); err != nil {
			return err
		}
		next, _, err := r.store.Checkpoint(p)
		if errors.Is(err, store.ErrCorruptCheckpoint) {
			// the store is a cache: restore the partition from the start
			r.log.Warn("changelog checkpoint is corrupt; restoring the partition from the start of the changelog",
				"topic", topic, "partition", p, "err", err)
			next, err = 0, nil
		}
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
	// the index entries of the states this restore wrote, by task: a later
	// record of the task replaces them without a point read of the store
	// (most tasks have several records in the changelog); bounded, past
	// which the store is read again
	applied := map[string]*task.State{}
	err = scan.Read(ctx, r.cfg.ClientOpts, ranges, func(b *scan.Batch) error {
		wb := r.store.NewBatch()
		if len(applied) > restoreMemo {
			clear(applied)
		}
		for _, rec := range b.Records {
			if err := r.applyChangelog(wb, rec, applied); err != nil {
				wb.Discard()
				return err
			}
			// a Pebble batch over half a memtable is sorted whole on commit:
			// commit in slices (applying a record twice is harmless, and the
			// checkpoint moves only at the end)
			if wb.Len() >= restoreSlice {
				if err := wb.Commit(); err != nil {
					return err
				}
				wb = r.store.NewBatch()
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
// state it replaces is the one an earlier record of this restore wrote
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
	st, err := r.codec.DecodeState(rec.Value) // an Avro TaskState, or the JSON of an earlier build
	if err != nil {
		r.log.Error("changelog record does not decode; skipped", "task_id", id, "partition", rec.Partition, "offset", rec.Offset, "err", err)
		return nil
	}
	applied[id] = indexOf(st)
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

// trustOrWipe keeps the local state of partition p if this instance released
// p at changelog end offset end (nothing was written to the changelog
// partition since, by anyone), and wipes it otherwise: after a restart
// without a clean release, or when another instance owned p meanwhile.
func (r *Router) trustOrWipe(p int32, end int64) error {
	released, ok, err := r.store.TakeReleased(p)
	if err != nil {
		return err
	}
	if ok && released == end {
		return nil
	}
	n, err := r.store.WipePartition(p)
	if err != nil {
		return err
	}
	if n > 0 || ok {
		r.log.Info("local state of the partition dropped: the partition was not held continuously; restoring it from the changelog's start",
			"topic", r.cfg.Topics.State, "partition", p, "tasks", n, "released_at", released, "end", end, "released", ok)
	}
	return nil
}

// markReleased records, for each partition, the end offset of its changelog
// as this instance lets it go. It is bounded: on failure no mark is written,
// and the partition is restored from the changelog's start when it comes
// back.
func (r *Router) markReleased(ctx context.Context, cl *kgo.Client, parts []int32) {
	if len(parts) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	adm := kadm.NewClient(cl)
	stable, err := adm.ListCommittedOffsets(ctx, r.cfg.Topics.State)
	if err == nil {
		var hw kadm.ListedOffsets
		if hw, err = adm.ListEndOffsets(ctx, r.cfg.Topics.State); err == nil {
			for _, p := range parts {
				s, ok1 := stable.Lookup(r.cfg.Topics.State, p)
				h, ok2 := hw.Lookup(r.cfg.Topics.State, p)
				if !ok1 || !ok2 || s.Err != nil || h.Err != nil || s.Offset != h.Offset {
					continue // unknown, or a transaction still open: no mark
				}
				if err := r.store.SetReleased(p, s.Offset); err != nil {
					r.log.Warn("release mark not written; the partition is restored from the changelog's start when it comes back", "partition", p, "err", err)
				}
			}
		}
	}
	if err != nil {
		r.log.Warn("changelog end unknown at release; the partitions are restored from the changelog's start when they come back", "partitions", parts, "err", err)
	}
}
