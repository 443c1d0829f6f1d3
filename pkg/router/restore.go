package router

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/scan"
	"github.com/faultrouter/faultrouter/pkg/store"
)

// restoreMemo bounds how many tasks' index entries a restore remembers.
const restoreMemo = 200_000

// A restore writes what it read in windows: one window is collected while
// the one before it is written, so a restore holds about two. A window ends
// at restoreWindow bytes of changelog (keys and values, replaced records
// included). A restore of up to restoreWindow bytes is one window: read
// whole, then written as one set of sstables that do not overlap anything
// in a wiped store, so Pebble links them into its last level and never
// compacts them. Each window after the first overlaps what the ones before
// wrote: its files go to a higher level, and Pebble compacts them with the
// rest, rewriting it (BenchmarkRestoreApply, in two windows, spends about
// a tenth of its CPU compacting). restoreWindow bounds the restore's memory
// (about twice restoreWindow, records and their writes) and sets how much a
// large restore compacts.
const restoreWindow = 64 << 20

// memo is what the restore remembers of a task it wrote: the index entries
// its write left (a value without pointers, for a map of many).
type memo struct {
	deleted bool
	x       store.Entries
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
//
// The records are applied compacted, in windows (see applier): only the
// last record of a task in a window is decoded and written, while the next
// window is read.
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
	wiped := map[int32]bool{}
	for _, p := range parts {
		kept, err := r.trustOrWipe(p, ends[p])
		if err != nil {
			return err
		}
		wiped[p] = !kept
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
	ap := r.newApplier(wiped)
	win := newWindow(int(remaining))
	err = scan.Read(ctx, r.cfg.ClientOpts, ranges, func(b *scan.Batch) error {
		for _, rec := range b.Records {
			win.add(rec)
			if win.full() {
				// the window ends within the fetch: its checkpoints are
				// past its own records only
				if err := ap.send(win); err != nil {
					return err
				}
				win = newWindow(int(remaining))
			}
		}
		for p, n := range b.Next[topic] {
			win.next[p] = n
		}
		total += int64(len(b.Records))
		r.metrics.restoredRecords.Add(float64(len(b.Records)))
		r.metrics.restoreRemaining.Set(float64(b.Left))
		if time.Since(lastLog) > 5*time.Second {
			r.log.Info("restoring state", "applied", total, "partitions_left", b.Partitions)
			lastLog = time.Now()
		}
		return nil
	})
	if err == nil {
		win.final = true
		err = ap.send(win)
	}
	if werr := ap.close(); err == nil {
		err = werr
	}
	if err != nil {
		return fmt.Errorf("router: restore: %w", err)
	}
	r.metrics.restoreRemaining.Set(0)
	r.log.Info("state restored", "topic", topic, "records", total, "took", time.Since(began).Round(time.Millisecond))
	return nil
}

// window is the changelog a restore read and has not written yet: the last
// record of each task (a state, or a tombstone), and where each partition's
// read stands.
type window struct {
	last  []*kgo.Record   // each task's last record, in the order of its first
	at    map[string]int  // a task's index in last
	next  map[int32]int64 // the checkpoints to write with the window
	bytes int             // of every record added, replaced ones too
	final bool            // the restore's last window: no window replaces its states
}

// newWindow returns an empty window with room for about n tasks.
func newWindow(n int) *window {
	n = min(n, restoreWindow/256)
	return &window{last: make([]*kgo.Record, 0, n), at: make(map[string]int, n), next: map[int32]int64{}}
}

// full reports whether the window is as large as a window gets.
func (w *window) full() bool { return w.bytes >= restoreWindow }

func (w *window) add(rec *kgo.Record) {
	// a lookup by string(bytes) does not allocate: a task's key is
	// copied only for its first record of the window
	if i, ok := w.at[string(rec.Key)]; ok {
		w.last[i] = rec
	} else {
		w.at[string(rec.Key)] = len(w.last)
		w.last = append(w.last, rec)
	}
	w.next[rec.Partition] = rec.Offset + 1
	w.bytes += len(rec.Key) + len(rec.Value)
}

// applier writes a restore's windows to the store, in order, in a goroutine
// of its own while the scan reads on.
//
// Only the last record of a task in a window is applied: for the store, a
// task's records one after another come to the same as its last one (a
// tombstone deletes), provided the write replaces the index entries of the
// state the store held before the window. That state is the one an earlier
// window of this restore wrote (written), else nothing in a partition this
// restore wiped, else the store's (a point read). A task changed twice (a
// retry decided, then published) must not leave the first state's due-index
// entry behind, or stale entries pile up at the head of the due index.
type applier struct {
	r       *Router
	wiped   map[int32]bool  // partitions wiped before this restore: the store held nothing of them
	written map[string]memo // index entries of the states written (not of the final window)
	forgot  bool            // written was cleared (restoreMemo): read the store for tasks not in it
	in      chan *window
	failed  atomic.Pointer[error] // the first window that failed
	done    chan struct{}
}

func (r *Router) newApplier(wiped map[int32]bool) *applier {
	a := &applier{r: r, wiped: wiped,
		in: make(chan *window), done: make(chan struct{})}
	go func() {
		defer close(a.done)
		for w := range a.in {
			if a.failed.Load() != nil {
				continue // drained, not written
			}
			if err := a.apply(w); err != nil {
				a.failed.Store(&err)
			}
		}
	}()
	return a
}

// send hands w to the applier, waiting while the window before is being
// written; it returns the error of an earlier window.
func (a *applier) send(w *window) error {
	if err := a.failed.Load(); err != nil {
		return *err
	}
	a.in <- w
	return nil
}

// close waits until every window sent is written and returns the first error.
func (a *applier) close() error {
	close(a.in)
	<-a.done
	if err := a.failed.Load(); err != nil {
		return *err
	}
	return nil
}

// change is one task's write of a window.
type change struct {
	rec *kgo.Record
	x   store.Entries // the index entries of its state
	del bool          // a tombstone
	bad error         // the record does not decode: skipped
}

// apply writes one window: its tasks' last states and their index entries,
// and the checkpoints, as one store.Bulk. The states are read and their
// writes built on every core, in task ID order (so that most of the
// store's keys come sorted). A last record that does not decode is logged
// and skipped: the task keeps what the store held before the window.
func (a *applier) apply(w *window) error {
	cs := make([]change, len(w.last))
	for i, rec := range w.last {
		cs[i].rec = rec
	}
	cs = sortByTask(cs)
	if a.written == nil {
		a.written = make(map[string]memo, min(len(cs), restoreMemo))
	}
	if len(a.written) > restoreMemo {
		clear(a.written)
		a.forgot = true
	}
	workers := min(runtime.GOMAXPROCS(0), 1+len(cs)/2000)
	bulks := make([]*store.Bulk, workers)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for k := range workers {
		part := cs[k*len(cs)/workers : (k+1)*len(cs)/workers]
		// a state's writes: itself, its owner and member entries, and at
		// most three index entries
		bulks[k] = a.r.store.NewBulk(6 * len(part))
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[k] = a.build(bulks[k], part)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for i := range cs {
		c := &cs[i]
		if c.bad != nil {
			a.r.log.Error("changelog record does not decode; skipped", "task_id", string(c.rec.Key), "partition", c.rec.Partition, "offset", c.rec.Offset, "err", c.bad)
		} else if !w.final {
			a.written[string(c.rec.Key)] = memo{deleted: c.del, x: c.x}
		}
	}
	bulk := bulks[0]
	for _, o := range bulks[1:] {
		bulk.Absorb(o)
	}
	for p, n := range w.next {
		if err := bulk.SetCheckpoint(p, n); err != nil {
			return err
		}
	}
	return bulk.Commit()
}

// sortByTask returns the changes of cs in task ID order: its halves are
// sorted on two cores and merged.
func sortByTask(cs []change) []change {
	byKey := func(x, y change) int { return bytes.Compare(x.rec.Key, y.rec.Key) }
	if len(cs) < 4096 || runtime.GOMAXPROCS(0) < 2 {
		slices.SortFunc(cs, byKey)
		return cs
	}
	x, y := cs[:len(cs)/2], cs[len(cs)/2:]
	done := make(chan struct{})
	go func() {
		slices.SortFunc(x, byKey)
		close(done)
	}()
	slices.SortFunc(y, byKey)
	<-done
	out := make([]change, 0, len(cs))
	for len(x) > 0 && len(y) > 0 {
		if byKey(y[0], x[0]) < 0 {
			out, y = append(out, y[0]), y[1:]
		} else {
			out, x = append(out, x[0]), x[1:]
		}
	}
	return append(append(out, x...), y...)
}

// build reads the states of cs and adds their writes to bulk.
func (a *applier) build(bulk *store.Bulk, cs []change) error {
	for i := range cs {
		c := &cs[i]
		key, p := c.rec.Key, c.rec.Partition // the task ID; string(key) in a map lookup does not allocate
		if c.rec.Value == nil {
			c.del = true
		} else if c.x, c.bad = a.r.entriesOf(c.rec.Value); c.bad != nil {
			continue
		}
		var old *store.Entries
		if m, ok := a.written[string(key)]; ok {
			if !m.deleted {
				old = &m.x
			}
		} else if a.forgot || !a.wiped[p] {
			st, err := a.r.store.Get(string(key))
			if err != nil {
				return err
			}
			if st != nil {
				x := store.EntriesOf(st)
				old = &x
			}
		}
		var err error
		if c.del {
			err = bulk.DeleteIndexed(p, key, old)
		} else {
			err = bulk.PutIndexed(p, key, old, c.x, c.rec.Value)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// entriesOf reads the index entries of an encoded state (an Avro
// TaskState, or the JSON of an earlier build), validating the whole record
// without building it (codec.DecodeStateIndex).
func (r *Router) entriesOf(v []byte) (store.Entries, error) {
	var x codec.StateIndex
	if err := r.codec.DecodeStateIndex(v, &x); err != nil {
		return store.Entries{}, err
	}
	return store.EntriesOfIndex(&x), nil
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
// without a clean release, or when another instance owned p meanwhile. It
// reports whether it kept the state.
func (r *Router) trustOrWipe(p int32, end int64) (kept bool, err error) {
	released, ok, err := r.store.TakeReleased(p)
	if err != nil {
		return false, err
	}
	if ok && released == end {
		return true, nil
	}
	n, err := r.store.WipePartition(p)
	if err != nil {
		return false, err
	}
	if n > 0 || ok {
		r.log.Info("local state of the partition dropped: the partition was not held continuously; restoring it from the changelog's start",
			"topic", r.cfg.Topics.State, "partition", p, "tasks", n, "released_at", released, "end", end, "released", ok)
	}
	return false, nil
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
