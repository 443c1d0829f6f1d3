package router

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/scan"
	"github.com/faultrouter/faultrouter/pkg/store"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// restoreMemo bounds how many tasks' index entries a restore remembers.
const restoreMemo = 200_000

// A restore writes what it read in windows: one window is collected while
// the one before it is written, so a restore holds about two. A window ends
// at restoreWindow bytes of changelog (keys and values), or at half of
// the records to restore (at least restoreWindowMin): a small restore is
// written in two windows, so that the first is written while the second is
// read. Each window after the first overlaps what the ones before wrote:
// its files go to Pebble's level 0, and Pebble compacts them with the rest,
// rewriting it. An eighth made the restore compact more and finish no
// sooner; a third spent about a quarter of its CPU compacting
// (BenchmarkRestoreApply: 4.1 µs per record in three windows, 3.3 in two,
// 3.0 in one, which reads everything before writing anything).
const (
	restoreWindow    = 32 << 20
	restoreWindowMin = 10_000
)

// indexed is the part of a state that names its store index entries: what
// store.Batch needs of the state a write replaces. A value, without
// pointers, for the restore's memo of what it wrote.
type indexed struct {
	deleted       bool
	pending       bool
	retry         task.PendingRetry // when pending
	expiresAt     int64
	review        string
	reviewDueAt   int64
	reviewAlerted bool
}

func indexOf(st *task.State) indexed {
	x := indexed{expiresAt: st.ExpiresAt, review: ownReview(st.Review), reviewDueAt: st.ReviewDueAt, reviewAlerted: st.ReviewAlerted}
	if st.Pending != nil {
		x.pending, x.retry = true, *st.Pending
	}
	return x
}

// ownReview returns a review status that shares no memory with a decoded
// record (codec.DecodeStateView): the constant, else a copy.
func ownReview(r string) string {
	for _, c := range []string{task.ReviewNone, task.ReviewOpen, task.ReviewApproved, task.ReviewRejected, task.ReviewResolved} {
		if r == c {
			return c
		}
	}
	return strings.Clone(r)
}

// state returns the state of task id as far as its index entries go, nil
// for a deleted task.
func (x indexed) state(id string) *task.State {
	if x.deleted {
		return nil
	}
	st := &task.State{TaskID: id, ExpiresAt: x.expiresAt, Review: x.review, ReviewDueAt: x.reviewDueAt, ReviewAlerted: x.reviewAlerted}
	if x.pending {
		p := x.retry
		st.Pending = &p
	}
	return st
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
	winRecords := max(int(remaining/2), restoreWindowMin)
	r.log.Info("restoring state from the changelog", "topic", topic, "partitions", len(ranges[topic]), "records", remaining)
	r.metrics.restoreRemaining.Set(float64(remaining))

	began, lastLog := time.Now(), time.Now()
	var total int64
	ap := r.newApplier(wiped)
	win := newWindow(winRecords)
	err = scan.Read(ctx, r.cfg.ClientOpts, ranges, func(b *scan.Batch) error {
		for _, rec := range b.Records {
			win.add(rec)
			if win.bytes >= restoreWindow || win.records >= winRecords {
				// the window ends within the fetch: its checkpoints are
				// past its own records only
				if err := ap.send(win); err != nil {
					return err
				}
				win = newWindow(winRecords)
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
	last    []*kgo.Record   // each task's last record, in the order of its first
	at      map[string]int  // a task's index in last
	next    map[int32]int64 // the checkpoints to write with the window
	bytes   int             // of every record added, replaced ones too
	records int
	final   bool // the restore's last window: no window replaces its states
}

// newWindow returns an empty window with room for about n tasks.
func newWindow(n int) *window {
	n = min(n, restoreWindow/256)
	return &window{last: make([]*kgo.Record, 0, n), at: make(map[string]int, n), next: map[int32]int64{}}
}

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
	w.records++
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
	wiped   map[int32]bool     // partitions wiped before this restore: the store held nothing of them
	written map[string]indexed // index entries of the states written (not of the final window)
	forgot  bool               // written was cleared (restoreMemo): read the store for tasks not in it
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
	st  *task.State // decoded; nil for a tombstone or a record that does not decode
	bad error       // the record does not decode
}

// apply writes one window: its tasks' last states (decoded in parallel),
// their index entries, and the checkpoints, as one store.Bulk. A last record
// that does not decode is logged and skipped: the task keeps what the store
// held before the window.
func (a *applier) apply(w *window) error {
	cs := make([]change, 0, len(w.last))
	for _, rec := range w.last {
		cs = append(cs, change{rec: rec})
	}
	// in task ID order, so that the store's index entries come mostly
	// sorted (store.Bulk sorts them)
	slices.SortFunc(cs, func(x, y change) int { return bytes.Compare(x.rec.Key, y.rec.Key) })
	decodeAll(a.r, cs)
	if a.written == nil {
		a.written = make(map[string]indexed, min(len(cs), restoreMemo))
	}
	if len(a.written) > restoreMemo {
		clear(a.written)
		a.forgot = true
	}
	// a state's writes: itself, its owner and member entries, and at most
	// three index entries
	bulk := a.r.store.NewBulk(6*len(cs) + len(w.next))
	for i := range cs {
		c := &cs[i]
		key := c.rec.Key // the task ID; string(key) in a map lookup does not allocate
		if c.bad != nil {
			a.r.log.Error("changelog record does not decode; skipped", "task_id", string(key), "partition", c.rec.Partition, "offset", c.rec.Offset, "err", c.bad)
			continue
		}
		var old *task.State
		x, ok := a.written[string(key)]
		if ok {
			old = x.state(string(key))
		} else if a.forgot || !a.wiped[c.rec.Partition] {
			var err error
			if old, err = a.r.store.Get(string(key)); err != nil {
				return err
			}
		}
		if c.st == nil {
			if !w.final {
				a.written[string(key)] = indexed{deleted: true}
			}
			if err := bulk.DeleteTask(c.rec.Partition, old); err != nil {
				return err
			}
			continue
		}
		if !w.final {
			a.written[string(key)] = indexOf(c.st)
		}
		if err := bulk.PutEncoded(c.rec.Partition, old, c.st, c.rec.Value); err != nil {
			return err
		}
	}
	for p, n := range w.next {
		if err := bulk.SetCheckpoint(p, n); err != nil {
			return err
		}
	}
	return bulk.Commit()
}

// decodeAll decodes the states of cs, split across the cores.
func decodeAll(r *Router, cs []change) {
	workers := min(runtime.GOMAXPROCS(0), 1+len(cs)/1000)
	var wg sync.WaitGroup
	for k := range workers {
		part := cs[k*len(cs)/workers : (k+1)*len(cs)/workers]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range part {
				if v := part[i].rec.Value; v != nil {
					// an Avro TaskState, or the JSON of an earlier build; its
					// strings share the record's bytes (kept until written)
					part[i].st, part[i].bad = r.codec.DecodeStateView(v)
				}
			}
		}()
	}
	wg.Wait()
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
