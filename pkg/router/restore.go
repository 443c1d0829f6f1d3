package router

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	rtmetrics "runtime/metrics"
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

// restoreMemo bounds how many tasks' index entries a restore remembers
// (about 100 bytes each). Past it, the restore waits until its windows are
// written, forgets them, and reads the store for the tasks it meets again.
const restoreMemo = 1_000_000

// A restore writes what it read in windows: one window is built while the
// one before it is written, so a restore holds about two. A window ends at
// restoreWindow bytes of changelog (keys and values, replaced records
// included). A restore of up to restoreWindow bytes is one window, written
// once the read ends as one set of sstables that do not overlap anything in
// a wiped store, so Pebble links them into its last level and never
// compacts them. Each window after the first overlaps what the ones before
// wrote: its files go to a higher level, and Pebble compacts them with the
// rest, rewriting it (BenchmarkRestoreApply, in two windows, spends about
// a tenth of its CPU compacting). restoreWindow bounds the restore's memory
// (about six times restoreWindow in flight: two windows' records, writes
// and sorted copies) and sets how much a large restore compacts: 32 MiB
// windows made a 500,000-record restore half again as slow, and 128 MiB
// windows made it a tenth faster at nearly twice the memory.
var restoreWindow = 64 << 20 // a variable for tests

// memo is what the restore remembers of a task it wrote: the index entries
// its last write left, and where that write is in its window (a value
// without pointers, for a map of many).
type memo struct {
	after held
	win   int32 // the window of the last write
	at    int32 // the task in that window's tasks
}

// held is a task's state as far as its index entries go: none (ok false:
// not stored, or deleted), or a state with entries x.
type held struct {
	ok bool
	x  store.Entries
}

func (h *held) entries() *store.Entries {
	if !h.ok {
		return nil
	}
	return &h.x
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
// The records are applied as they are read, in windows (see restorer):
// only the last state of a task in a window is stored.
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
	defer relaxGC()()
	rs := r.newRestorer(wiped, int(remaining))
	err = scan.Read(ctx, r.cfg.ClientOpts, ranges, func(b *scan.Batch) error {
		if err := rs.add(b.Records, b.Next[topic]); err != nil {
			return err
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
	if werr := rs.close(); err == nil {
		err = werr
	}
	if err != nil {
		return fmt.Errorf("router: restore: %w", err)
	}
	r.metrics.restoreRemaining.Set(0)
	r.log.Info("state restored", "topic", topic, "records", total, "took", time.Since(began).Round(time.Millisecond))
	return nil
}

// restorer applies changelog records to the store as the restore reads
// them: a builder goroutine reads each record's state for its index entries
// and adds its writes to the window's store.Bulk while the next fetch is
// read, and a committer goroutine writes each full window (sorts it, writes
// its sstables, has Pebble ingest them) while the builder fills the next.
//
// Only a task's last record in a window is written: a later record drops
// the writes of the earlier one (Bulk.Drop). Its write replaces the index
// entries of the state the store holds before the window: the state an
// earlier window of this restore wrote (memo), else nothing in a partition
// this restore wiped, else the store's (a point read). A task changed twice
// (a retry decided, then published) must not leave the first state's
// due-index entry behind, or stale entries pile up at the head of the due
// index. A record that does not decode is logged and skipped: the task
// keeps the state before it.
type restorer struct {
	r     *Router
	wiped map[int32]bool // partitions wiped before this restore: the store held nothing of them
	hint  int            // records to restore, for the first window's room
	in    chan restoreStep
	built chan struct{} // closed when the builder has stopped

	// the builder's
	memo    map[string]memo // the index entries of the tasks this restore wrote
	forgot  bool            // memo was cleared (restoreMemo): read the store for tasks not in it
	bulk    *store.Bulk     // the window being built
	win     int32           // its number
	tasks   []written       // the tasks it writes, each once
	bytes   int             // of the records in bulk, replaced ones included
	lastOps int             // the writes of the window before
	next    map[int32]int64 // the checkpoints to write with the window

	commits   chan *store.Bulk // to the committer
	committed sync.WaitGroup   // windows sent to the committer and not yet written
	failed    atomic.Pointer[error]
}

// written is a task a window writes, its writes in the window's Bulk, and
// the index entries of its state before the window (what a later record
// of the task in the window replaces).
type written struct {
	id     []byte
	span   [2]int32
	before held
}

// restoreStep is what the builder is handed: a fetch's records and where
// the read stands after it, or an order to end the window (cut), and to
// forget the memo after it (forget).
type restoreStep struct {
	recs        []*kgo.Record
	next        map[int32]int64
	cut, forget bool
}

func (r *Router) newRestorer(wiped map[int32]bool, hint int) *restorer {
	rs := &restorer{r: r, wiped: wiped, hint: hint,
		in: make(chan restoreStep, 2), built: make(chan struct{}),
		memo: make(map[string]memo, min(hint, restoreMemo)), next: map[int32]int64{}, commits: make(chan *store.Bulk)}
	go func() { // the committer
		for b := range rs.commits {
			if rs.failed.Load() == nil {
				if err := b.Commit(); err != nil {
					rs.fail(err)
				}
			}
			rs.committed.Done()
		}
	}()
	go func() { // the builder
		defer close(rs.built)
		for st := range rs.in {
			if rs.failed.Load() != nil {
				continue // drained, not applied
			}
			if err := rs.step(st); err != nil {
				rs.fail(err)
			}
		}
		if rs.failed.Load() == nil {
			rs.cut()
		}
		rs.committed.Wait()
		close(rs.commits)
	}()
	return rs
}

func (rs *restorer) fail(err error) { rs.failed.CompareAndSwap(nil, &err) }

// add hands the records of one fetch to the builder, with where the read
// of each partition stands after them; it returns the error of an earlier
// step or window.
func (rs *restorer) add(recs []*kgo.Record, next map[int32]int64) error {
	if err := rs.failed.Load(); err != nil {
		return *err
	}
	rs.in <- restoreStep{recs: recs, next: next}
	return nil
}

// endWindow ends the window after the records added so far, and forget
// (restoreMemo reached) also clears the memo after it: for tests.
func (rs *restorer) endWindow(forget bool) { rs.in <- restoreStep{cut: true, forget: forget} }

// close writes what is left and waits until every window is written; it
// returns the first error.
func (rs *restorer) close() error {
	close(rs.in)
	<-rs.built
	if err := rs.failed.Load(); err != nil {
		return *err
	}
	return nil
}

func (rs *restorer) step(st restoreStep) error {
	from := 0 // the fetch's records not yet in a window's checkpoints
	for i, rec := range st.recs {
		if err := rs.apply(rec); err != nil {
			return err
		}
		if rs.bytes >= restoreWindow {
			// the window ends within the fetch: its checkpoints are past
			// its own records only
			rs.advance(st.recs[from : i+1])
			from = i + 1
			rs.cut()
		}
	}
	rs.advance(st.recs[from:])
	for p, n := range st.next {
		rs.next[p] = n
	}
	forget := st.forget || len(rs.memo) > restoreMemo
	if st.cut || forget {
		rs.cut()
	}
	if forget {
		// once the store holds every window written: read it for tasks
		// not remembered
		rs.committed.Wait()
		clear(rs.memo)
		rs.forgot = true
	}
	return nil
}

// advance moves the checkpoints past recs (a fetch's, partition by
// partition).
func (rs *restorer) advance(recs []*kgo.Record) {
	for i, rec := range recs {
		if i+1 == len(recs) || recs[i+1].Partition != rec.Partition {
			rs.next[rec.Partition] = max(rs.next[rec.Partition], rec.Offset+1)
		}
	}
}

// apply adds the writes of one changelog record to the window.
func (rs *restorer) apply(rec *kgo.Record) error {
	if rs.bulk == nil {
		// a state's writes: itself, its owner and member entries, and at
		// most three index entries, and the deletes of the index entries
		// of the state it replaces
		n := 5 * min(rs.hint, restoreWindow/1024)
		if rs.lastOps > 0 { // as many as the window before, and an eighth
			n = rs.lastOps + rs.lastOps/8
		}
		rs.bulk = rs.r.store.NewBulk(n)
	}
	key, p := rec.Key, rec.Partition // the task ID; string(key) in a map lookup does not allocate
	var x store.Entries
	if rec.Value != nil {
		var err error
		if x, err = rs.r.entriesOf(rec.Value); err != nil {
			rs.r.log.Error("changelog record does not decode; skipped", "task_id", string(key), "partition", p, "offset", rec.Offset, "err", err)
			return nil
		}
	}
	// the state before this window: an earlier window's write, else the
	// store's; a later state of a task written in this window replaces
	// that write
	var before held
	m, ok := rs.memo[string(key)]
	switch {
	case ok && m.win == rs.win:
		before = rs.tasks[m.at].before
		sp := rs.tasks[m.at].span
		rs.bulk.Drop(int(sp[0]), int(sp[1]))
	case ok:
		before = m.after
	case rs.forgot || !rs.wiped[p]:
		st, err := rs.r.store.Get(string(key))
		if err != nil {
			return err
		}
		if st != nil {
			before = held{ok: true, x: store.EntriesOf(st)}
		}
	}
	from := rs.bulk.Len()
	var err error
	if rec.Value == nil {
		err = rs.bulk.DeleteIndexed(p, key, before.entries())
		m = memo{}
	} else {
		err = rs.bulk.PutIndexed(p, key, before.entries(), x, rec.Value)
		m = memo{after: held{ok: true, x: x}}
	}
	if err != nil {
		return err
	}
	sp := [2]int32{int32(from), int32(rs.bulk.Len())}
	if ok && m.win == rs.win {
		m.at = rs.memo[string(key)].at
		rs.tasks[m.at].span = sp
	} else {
		m.at = int32(len(rs.tasks))
		rs.tasks = append(rs.tasks, written{id: key, span: sp, before: before})
	}
	m.win = rs.win
	rs.memo[string(key)] = m
	rs.bytes += len(key) + len(rec.Value)
	return nil
}

// cut ends the window: its writes and checkpoints go to the committer.
func (rs *restorer) cut() {
	if rs.bulk == nil && len(rs.next) == 0 {
		return
	}
	if rs.bulk == nil {
		rs.bulk = rs.r.store.NewBulk(len(rs.next))
	}
	// in task ID order: the Bulk's indexes then come mostly sorted
	sortWritten(rs.tasks)
	spans := make([][2]int32, len(rs.tasks))
	for i, t := range rs.tasks {
		spans[i] = t.span
	}
	rs.bulk.Order(spans)
	rs.tasks = rs.tasks[:0]
	for p, n := range rs.next {
		if err := rs.bulk.SetCheckpoint(p, n); err != nil {
			rs.fail(err)
			return
		}
	}
	rs.lastOps = rs.bulk.Len()
	rs.committed.Add(1)
	rs.commits <- rs.bulk
	rs.bulk, rs.bytes, rs.next = nil, 0, map[int32]int64{}
	rs.win++
}

// sortWritten sorts ws by task ID, its halves on two cores, then merged.
func sortWritten(ws []written) {
	byID := func(x, y written) int { return bytes.Compare(x.id, y.id) }
	if len(ws) < 4096 || runtime.GOMAXPROCS(0) < 2 {
		slices.SortFunc(ws, byID)
		return
	}
	x, y := ws[:len(ws)/2], ws[len(ws)/2:]
	done := make(chan struct{})
	go func() {
		slices.SortFunc(x, byID)
		close(done)
	}()
	slices.SortFunc(y, byID)
	<-done
	out := make([]written, 0, len(ws))
	for len(x) > 0 && len(y) > 0 {
		if byID(y[0], x[0]) < 0 {
			out, y = append(out, y[0]), y[1:]
		} else {
			out, x = append(out, x[0]), x[1:]
		}
	}
	copy(ws, append(append(out, x...), y...))
}

// relaxGC lets the heap grow by up to eight windows (a restore in flight
// holds about six: two windows' records, writes and fetches) before the
// garbage collector runs, for a restore's duration, and returns the
// function that undoes it. A restore allocates its windows in bulk and
// keeps most of what it allocates until the window is written: collecting
// as the heap doubled marked the same window over and over (a fifth of a
// restore's CPU), and a bound of three windows left the collector running
// back to back in a restore of several windows. A memory limit set for the
// process (GOMEMLIMIT) still applies. Restores running at once (routers in
// one process) share one relaxation.
func relaxGC() (undo func()) {
	gcRelax.Lock()
	defer gcRelax.Unlock()
	if gcRelax.n++; gcRelax.n == 1 {
		s := []rtmetrics.Sample{{Name: "/gc/heap/live:bytes"}}
		rtmetrics.Read(s)
		live := int64(0)
		if s[0].Value.Kind() == rtmetrics.KindUint64 {
			live = int64(s[0].Value.Uint64())
		}
		gcRelax.limit = debug.SetMemoryLimit(-1)
		gcRelax.percent = debug.SetGCPercent(-1)
		debug.SetMemoryLimit(min(gcRelax.limit, 2*live+8*int64(restoreWindow)+64<<20))
	}
	return func() {
		gcRelax.Lock()
		defer gcRelax.Unlock()
		if gcRelax.n--; gcRelax.n == 0 {
			debug.SetGCPercent(gcRelax.percent)
			debug.SetMemoryLimit(gcRelax.limit)
		}
	}
}

var gcRelax struct {
	sync.Mutex
	n       int
	limit   int64
	percent int
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
