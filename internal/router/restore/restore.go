// Package restore is the restore of the router's state store from the state
// changelog: on an assignment it brings the Pebble cache of the partitions
// assigned up to the changelog before they are routed (Restorer.Restore),
// and on a revoke it marks the partitions released at the changelog's end
// (Restorer.MarkReleased), so that the next assignment knows what of the
// local state it may trust. The store is a cache of the changelog: what the
// restore writes is exactly what the compacted changelog says, each task's
// last record in the order written.
package restore

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/gcpace"
	"github.com/faultrouter/faultrouter/internal/scan"
	"github.com/faultrouter/faultrouter/internal/store"
	"github.com/faultrouter/faultrouter/pkg/codec"
)

// A restore writes what it read in windows: one window is built while the
// one before it is written, so a restore holds about two. A restore reads
// the partitions in groups, one after the other, each group of about
// restoreGroup bytes of changelog (estimated from its offsets), and a
// window is one group: the store's keys start with the partition (see
// package store), so the sstables of a window of whole partitions overlap
// nothing an earlier window wrote, and Pebble links them into its last
// level without compacting anything. Groups of a quarter of a window
// overlap the read of a group with the write of the one before.
//
// A group larger than restoreWindow bytes (keys and values, replaced
// records included) is cut into several windows; the later windows of a
// partition overlap the earlier ones, so Pebble compacts them.
// restoreWindow bounds the restore's memory (about six times restoreWindow
// in flight: two windows' records, writes and sorted copies).
var restoreWindow = 64 << 20 // a variable for tests

// maxCarried bounds the tasks whose index entries a restore keeps in memory
// for the later windows of the partitions larger than a window
// (restoreWriter.carried): about 100 bytes each, as much as a window.
var maxCarried = restoreWindow / 100 // a variable for tests

// restoreGroup is the changelog bytes the restore reads in one group, and
// restoreRecordBytes the size of a record it assumes until it has read
// some (a state of a task in flight, compressed about 3:1 on the wire).
var (
	restoreGroup       = restoreWindow / 4
	restoreRecordBytes = 256
)

// ErrUnreadableState is returned by a restore that met a changelog record
// this build cannot read: a state written by a build outside its schema
// window, or bytes that are not a state. The restore of the partition stops
// there, rather than skip the record and route on with the state before it
// (or none): that would republish retries, forget pending ones, and let
// dedup sets and held writes lapse. The error names the record (topic,
// partition, offset, task) and the writer schema's fingerprint.
var ErrUnreadableState = errors.New("router: changelog record this build cannot read")

// Config is what a Restorer takes: the changelog it reads (a topic and the
// options of the clients that read it), the producers' transaction timeout
// (how long an open transaction on it may take to end), the store it
// writes, its logger and its metrics (nil: none).
type Config struct {
	Topic              string
	ClientOpts         []kgo.Opt
	TransactionTimeout time.Duration
	Store              *store.Store
	Log                *slog.Logger
	Metrics            *Metrics
}

// Metrics are a restore's metrics (NewMetrics).
type Metrics struct {
	// Records counts the changelog records applied; Unreadable those a
	// restore stopped at (ErrUnreadableState).
	Records, Unreadable prometheus.Counter
	Seconds             prometheus.Histogram
	Remaining           prometheus.Gauge // records left (approximate, offsets)
}

// NewMetrics returns the restore's metrics, not registered (Collectors).
func NewMetrics() *Metrics {
	const ns = "faultrouter"
	return &Metrics{
		Records: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "restore_records_total",
			Help: "Changelog records applied to the state store during restores."}),
		Unreadable: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "restore_unreadable_records_total",
			Help: "Changelog records a restore could not read and stopped at (the partition is not routed until this build can read them)."}),
		Seconds: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "restore_seconds",
			Help: "Time to bring the state of an assignment up to the end of the changelog.", Buckets: prometheus.ExponentialBuckets(0.01, 2, 14)}),
		Remaining: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "restore_remaining_records",
			Help: "Changelog records left to restore (approximate, offsets)."}),
	}
}

// Collectors are the metrics to register.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.Records, m.Unreadable, m.Seconds, m.Remaining}
}

// Restorer is the restore of the state store from the changelog, one part
// of the router: it owns bringing the store of the partitions assigned to
// this instance up to the changelog before they are routed, and what the
// store keeps of a partition released. On an assignment it decides what of the
// local state to trust (trustOrWipe, ownWritesOnly), waits for the
// changelog's open transactions (stableEnds) and reads the changelog from
// the checkpoint to its end into the store (Restore; restoreWriter); on a
// revoke it marks the partitions released at the changelog's end
// (MarkReleased). It runs in the assignment callbacks, with the session's
// client for the offsets.
type Restorer struct {
	topic      string    // the state changelog
	clientOpts []kgo.Opt // of the clients that read it
	txTimeout  time.Duration
	store      *store.Store
	log        *slog.Logger
	metrics    *Metrics
}

// New returns the restore of c.Store from the changelog c.Topic.
func New(c Config) *Restorer {
	m := c.Metrics
	if m == nil {
		m = NewMetrics()
	}
	return &Restorer{topic: c.Topic, clientOpts: c.ClientOpts, txTimeout: c.TransactionTimeout,
		store: c.Store, log: c.Log, metrics: m}
}

// Restore brings the Pebble cache of the given partitions up to the end of
// the state changelog, from the checkpoint offset kept in Pebble. It waits
// for open transactions on the changelog to finish first (a previous owner's
// last transaction commits or aborts), so that nothing committed is missed.
//
// The local state of a partition is kept only if this instance released
// the partition cleanly, and either every changelog record since can still
// be read (canCatchUp: it comes back within half the changelog's
// delete.retention.ms, as in a rolling restart) or no other instance has
// written to it since (the changelog has not moved, or only with records
// of this instance's own transactional producer: its batch in flight at
// the release, committed or aborted after it); the restore then applies
// the records from the checkpoint (trustOrWipe). Else it is wiped and the
// partition restored from the changelog's start.
// Restoring from the checkpoint alone, past that, would keep state the
// changelog no longer holds: while another instance owned the partition it
// may have finished a task, and compaction may have dropped the task's
// records and then its tombstone, so that no record after the checkpoint
// says the local copy (a pending retry, an open review item) is gone.
//
// The records are applied as they are read, in windows (see restoreWriter):
// only the last state of a task in a window is stored.
func (rs *Restorer) Restore(ctx context.Context, cl *kgo.Client, parts []int32) error {
	if len(parts) == 0 {
		return nil
	}
	topic := rs.topic
	entered := time.Now()
	defer func() { rs.metrics.Seconds.Observe(time.Since(entered).Seconds()) }()
	adm := kadm.NewClient(cl)
	ends, err := rs.stableEnds(ctx, adm, topic, parts)
	if err != nil {
		return err
	}
	ranges := scan.Ranges{}
	wiped := map[int32]bool{}
	limits := &catchUpLimits{}
	for _, p := range parts {
		kept, err := rs.trustOrWipe(ctx, cl, limits, p, ends[p])
		if err != nil {
			return err
		}
		wiped[p] = !kept
		next, _, err := rs.store.Checkpoint(p)
		if errors.Is(err, store.ErrCorruptCheckpoint) {
			// the store is a cache: restore the partition from the start
			rs.log.Warn("changelog checkpoint is corrupt; restoring the partition from the start of the changelog",
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
		rs.log.Info("state is up to date", "topic", topic, "partitions", parts)
		return nil
	}
	remaining := ranges.Len()
	rs.log.Info("restoring state from the changelog", "topic", topic, "partitions", len(ranges[topic]), "records", remaining)
	rs.metrics.Remaining.Set(float64(remaining))

	began, lastLog := time.Now(), time.Now()
	var total, read int64
	defer relaxGC()()
	w := rs.newWriter(wiped)
	// a partition's fetches may be as large as a group: one partition is
	// often read alone
	opts := append(slices.Clip(rs.clientOpts), kgo.FetchMaxPartitionBytes(int32(max(restoreGroup, 1<<20))))
	for _, g := range restoreGroups(topic, ranges[topic], restoreGroup/restoreRecordBytes) {
		left, size := remaining-read, g.Len()
		w.hint(size)
		err = scan.Read(ctx, opts, g, func(b *scan.Batch) error {
			if err := w.add(b.Records, b.Next[topic]); err != nil {
				return err
			}
			total += int64(len(b.Records))
			rs.metrics.Records.Add(float64(len(b.Records)))
			rs.metrics.Remaining.Set(float64(left - (size - b.Left)))
			if time.Since(lastLog) > 5*time.Second {
				rs.log.Info("restoring state", "applied", total, "records_left", left-(size-b.Left))
				lastLog = time.Now()
			}
			return nil
		})
		if err != nil {
			break
		}
		read += size
		w.endWindow()
	}
	if werr := w.close(); err == nil {
		err = werr
	}
	if err != nil {
		return fmt.Errorf("router: restore: %w", err)
	}
	rs.metrics.Remaining.Set(0)
	rs.log.Info("state restored", "topic", topic, "records", total, "took", time.Since(began).Round(time.Millisecond))
	return nil
}

// restoreGroups splits the partitions to restore into groups read one
// after the other, in partition order, each of about size offsets or one
// partition.
func restoreGroups(topic string, parts map[int32]scan.Range, size int) []scan.Ranges {
	var groups []scan.Ranges
	var g scan.Ranges
	n := int64(0)
	for _, p := range slices.Sorted(maps.Keys(parts)) {
		r := parts[p]
		if g != nil && n+(r.End-r.Start) > int64(size) {
			groups, g = append(groups, g), nil
		}
		if g == nil {
			g, n = scan.Ranges{}, 0
		}
		g.Set(topic, p, r)
		n += r.End - r.Start
	}
	if g != nil {
		groups = append(groups, g)
	}
	return groups
}

// restoreWriter applies changelog records to the store as the restore reads
// them: a builder goroutine reads each record's state for its index entries
// and adds its writes to the window's store.Bulk while the next fetch is
// read, and a committer goroutine writes each full window (sorts it, writes
// its sstables, has Pebble ingest them) while the builder fills the next.
//
// Only a task's last record in a window is written: at the window's end
// its tasks are sorted, and the writes of a task's earlier records are left
// out (Bulk.Order). Each record's writes replace the index entries of the
// state the store holds before the window: nothing in a partition this
// restore wiped and has not written yet, else the store's (a point read,
// once the windows before are written). A task changed twice (a retry
// decided, then published) must not leave the first state's due-index
// entry behind, or stale entries pile up at the head of the due index.
//
// A partition larger than a window is written in several. A window after
// the first of a partition the restore wiped takes the state before it from
// what the windows before wrote (carried, up to maxCarried tasks), kept in
// memory, not from the store: a point read of every record, after waiting
// for the window before to be written, was about half the time of a restore of
// partitions of three windows (BenchmarkRestoreApply, window=8MiB).
//
// A record that does not decode stops the restore (ErrUnreadableState):
// nothing of its window is written and its partition's checkpoint stays
// before it, so the partition is not routed on a state that lost the record.
type restoreWriter struct {
	store   *store.Store
	metrics *Metrics
	fresh   map[int32]bool // partitions the store holds nothing of: wiped, and not in a window written yet
	// carried are, for each partition that was wiped and continues past
	// the window being built, the index entries of every task the windows
	// before wrote: all the store holds of the partition
	carried map[int32]map[string]store.Entries
	in      chan restoreStep
	built   chan struct{} // closed when the builder has stopped

	// the builder's
	bulk    *store.Bulk     // the window being built
	size    int             // the records of the group being read
	tasks   []written       // the records it writes, a task's last one kept
	entries []writtenState  // the state of each of them, in the order read
	parts   map[int32]bool  // the partitions it has records of
	bytes   int             // of the records in bulk
	waited  bool            // the windows before this one are written
	lastOps int             // the writes of the window before
	next    map[int32]int64 // the checkpoints to write with the window

	commits   chan *store.Bulk // to the committer
	committed sync.WaitGroup   // windows sent to the committer and not yet written
	failed    atomic.Pointer[error]
}

// written is a record a window writes: its task, its writes in the
// window's Bulk, and the order it was read in.
type written struct {
	id   []byte
	p    int32
	span [2]int32
	n    int32 // its place in restoreWriter.entries: the order it was read in
}

// writtenState is the state a record of a window writes: its index
// entries, or none (a tombstone).
type writtenState struct {
	x   store.Entries
	del bool
}

// restoreStep is what the builder is handed: a fetch's records and where
// the read stands after it, the size of the next group (size), or an order
// to end the window (cut).
type restoreStep struct {
	recs []*kgo.Record
	next map[int32]int64
	size int
	cut  bool
}

// newWriter starts the goroutines of a restore's writer; close stops them.
// wiped are the partitions the restore wiped.
func (rs *Restorer) newWriter(wiped map[int32]bool) *restoreWriter {
	w := &restoreWriter{store: rs.store, metrics: rs.metrics, fresh: maps.Clone(wiped),
		in: make(chan restoreStep, 2), built: make(chan struct{}),
		parts: map[int32]bool{}, next: map[int32]int64{}, commits: make(chan *store.Bulk),
		carried: map[int32]map[string]store.Entries{}}
	for p, ok := range w.fresh {
		if !ok {
			delete(w.fresh, p)
		}
	}
	go func() { // the committer
		for b := range w.commits {
			if w.failed.Load() == nil {
				if err := b.Commit(); err != nil {
					w.fail(err)
				}
			}
			w.committed.Done()
		}
	}()
	go func() { // the builder
		defer close(w.built)
		for st := range w.in {
			if w.failed.Load() != nil {
				continue // drained, not applied
			}
			if err := w.step(st); err != nil {
				w.fail(err)
			}
		}
		if w.failed.Load() == nil {
			w.cut(true)
		}
		w.committed.Wait()
		close(w.commits)
	}()
	return w
}

func (w *restoreWriter) fail(err error) { w.failed.CompareAndSwap(nil, &err) }

// add hands the records of one fetch to the builder, with where the read
// of each partition stands after them; it returns the error of an earlier
// step or window.
func (w *restoreWriter) add(recs []*kgo.Record, next map[int32]int64) error {
	if err := w.failed.Load(); err != nil {
		return *err
	}
	w.in <- restoreStep{recs: recs, next: next}
	return nil
}

// hint tells the builder how many records the next group has, for the
// room of its window.
func (w *restoreWriter) hint(records int64) { w.in <- restoreStep{size: int(records)} }

// endWindow ends the window after the records added so far.
func (w *restoreWriter) endWindow() { w.in <- restoreStep{cut: true} }

// close writes what is left and waits until every window is written; it
// returns the first error.
func (w *restoreWriter) close() error {
	close(w.in)
	<-w.built
	if err := w.failed.Load(); err != nil {
		return *err
	}
	return nil
}

func (w *restoreWriter) step(st restoreStep) error {
	if st.size > 0 {
		w.size = st.size
	}
	from := 0 // the fetch's records not yet in a window's checkpoints
	for i, rec := range st.recs {
		if err := w.apply(rec); err != nil {
			return err
		}
		if w.bytes >= restoreWindow {
			// the window ends within the fetch: its checkpoints are past
			// its own records only
			w.advance(st.recs[from : i+1])
			from = i + 1
			w.cut(false)
		}
	}
	w.advance(st.recs[from:])
	for p, n := range st.next {
		w.next[p] = n
	}
	if st.cut {
		w.cut(true)
	}
	return nil
}

// advance moves the checkpoints past recs (a fetch's, partition by
// partition).
func (w *restoreWriter) advance(recs []*kgo.Record) {
	for i, rec := range recs {
		if i+1 == len(recs) || recs[i+1].Partition != rec.Partition {
			w.next[rec.Partition] = max(w.next[rec.Partition], rec.Offset+1)
		}
	}
}

// apply adds the writes of one changelog record to the window.
func (w *restoreWriter) apply(rec *kgo.Record) error {
	if w.bulk == nil {
		// a state's writes: itself and its expiry entry, and now and then
		// a due or overdue entry, or the deletes of the entries of the
		// state it replaces
		n := 3 * min(max(w.size, 1024), restoreWindow/restoreRecordBytes)
		if w.lastOps > 0 {
			n = min(n, w.lastOps+w.lastOps/8)
		}
		w.bulk = w.store.NewBulk(n)
	}
	key, p := rec.Key, rec.Partition
	var x store.Entries
	if rec.Value != nil {
		var err error
		if x, err = w.store.IndexEntries(rec.Value); err != nil {
			w.metrics.Unreadable.Inc()
			return fmt.Errorf("%w: %s partition %d offset %d, task %q, %s: %v",
				ErrUnreadableState, rec.Topic, p, rec.Offset, key, writerSchema(rec.Value), err)
		}
	}
	// the state before this window: none in a fresh partition, else the
	// store's, once every window before this one is written
	var before *store.Entries // nil: the store holds none
	if m, ok := w.carried[p]; ok {
		if x, ok := m[string(key)]; ok {
			before = &x
		}
	} else if !w.fresh[p] {
		if !w.waited {
			w.committed.Wait()
			w.waited = true
		}
		stored, ok, err := w.store.EntriesOf(p, key)
		if err != nil {
			return err
		}
		if ok {
			before = &stored
		}
	}
	from := w.bulk.Len()
	var err error
	if rec.Value == nil {
		err = w.bulk.DeleteIndexed(p, key, before)
	} else {
		err = w.bulk.PutIndexed(p, key, before, x, rec.Value)
	}
	if err != nil {
		return err
	}
	w.tasks = append(w.tasks, written{id: key, p: p, span: [2]int32{int32(from), int32(w.bulk.Len())}, n: int32(len(w.entries))})
	w.entries = append(w.entries, writtenState{x: x, del: rec.Value == nil})
	w.parts[p] = true
	w.bytes += len(key) + len(rec.Value)
	return nil
}

// cut ends the window: its writes and checkpoints go to the committer.
// last tells that it ends the group it is read in, and so every partition
// it has records of; else those partitions go on in the next window.
func (w *restoreWriter) cut(last bool) {
	if w.bulk == nil && len(w.next) == 0 {
		return
	}
	if w.bulk == nil {
		w.bulk = w.store.NewBulk(len(w.next))
	}
	// in task order, each task's records in the order read: the Bulk's
	// indexes then come mostly sorted, and only a task's last record is
	// kept
	sortWritten(w.tasks)
	// the partitions that go on in the next window and whose whole state
	// in the store this restore wrote: the next window takes what this one
	// writes from memory
	if last {
		clear(w.carried) // a partition is read in one group
	} else {
		for p := range w.parts {
			if _, ok := w.carried[p]; !ok && w.fresh[p] {
				w.carried[p] = map[string]store.Entries{}
			}
		}
	}
	spans := make([][2]int32, 0, len(w.tasks))
	for i, t := range w.tasks {
		if i+1 < len(w.tasks) && w.tasks[i+1].p == t.p && bytes.Equal(w.tasks[i+1].id, t.id) {
			continue // a later record of the task replaces this one
		}
		spans = append(spans, t.span)
		if m, ok := w.carried[t.p]; ok {
			if e := w.entries[t.n]; e.del {
				delete(m, string(t.id))
			} else {
				m[string(t.id)] = e.x
			}
		}
	}
	if !last {
		n := 0
		for _, m := range w.carried {
			n += len(m)
		}
		if n > maxCarried {
			// a partition of many tasks: its later windows read the store
			clear(w.carried)
		}
	}
	w.bulk.Order(spans)
	w.tasks, w.entries = w.tasks[:0], w.entries[:0]
	for p, n := range w.next {
		if err := w.bulk.SetCheckpoint(p, n); err != nil {
			w.fail(err)
			return
		}
	}
	// a later window of these partitions replaces what this one wrote
	for p := range w.parts {
		delete(w.fresh, p)
	}
	clear(w.parts)
	w.lastOps = w.bulk.Len()
	w.committed.Add(1)
	w.commits <- w.bulk
	w.bulk, w.bytes, w.next, w.waited = nil, 0, map[int32]int64{}, false
}

// writtenOrder orders the records of a window by task (partition, then ID),
// a task's records in the order they were read (n). Not by where their
// writes start in the Bulk: a tombstone of a task the store does not hold
// writes nothing, so its empty span starts where the next record's does,
// and a tie there could keep the tombstone and drop the state after it.
func writtenOrder(x, y written) int {
	if c := cmp.Compare(x.p, y.p); c != 0 {
		return c
	}
	if c := bytes.Compare(x.id, y.id); c != 0 {
		return c
	}
	return cmp.Compare(x.n, y.n)
}

// sortWritten sorts ws by writtenOrder, its halves on two cores, then
// merged.
func sortWritten(ws []written) {
	if len(ws) < 4096 || runtime.GOMAXPROCS(0) < 2 {
		slices.SortFunc(ws, writtenOrder)
		return
	}
	x, y := ws[:len(ws)/2], ws[len(ws)/2:]
	done := make(chan struct{})
	go func() {
		slices.SortFunc(x, writtenOrder)
		close(done)
	}()
	slices.SortFunc(y, writtenOrder)
	<-done
	out := make([]written, 0, len(ws))
	for len(x) > 0 && len(y) > 0 {
		if writtenOrder(y[0], x[0]) < 0 {
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
	return gcpace.Relax(8*int64(restoreWindow) + 64<<20)
}

// stableEnds returns the end offsets of the changelog partitions once no
// transaction is open on them (last stable offset equals high watermark),
// waiting at most the transaction timeout plus a margin. It looks again
// after 10 ms, doubling up to 200 ms: a partition handed over in a
// rebalance usually has its previous owner's last transaction open for a
// few tens of milliseconds more (committed as that instance shuts down, or
// aborted as its session learns of the revoke), and a first look 200 ms
// later held every hand-over that long.
func (rs *Restorer) stableEnds(ctx context.Context, adm *kadm.Client, topic string, parts []int32) (map[int32]int64, error) {
	deadline := time.Now().Add(rs.txTimeout + 15*time.Second)
	wait := 10 * time.Millisecond
	for {
		// the stable offsets first, the end offsets after: a transaction
		// open at the first listing shows in the second (listed the other
		// way round, or at once, one that began between them would not,
		// and its records, if it commits, would be missed)
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
		case <-time.After(wait):
		}
		wait = min(2*wait, 200*time.Millisecond)
	}
}

// trustOrWipe keeps the local state of partition p if this instance released
// p cleanly and every changelog record written since can still be read
// (canCatchUp), or nothing was written since but by this instance
// (ownWritesOnly): the restore then applies the records from the
// partition's checkpoint. It wipes it otherwise: after a restart without a
// clean release, or when another instance owned p too long ago. It
// reports whether it kept the state.
func (rs *Restorer) trustOrWipe(ctx context.Context, cl *kgo.Client, limits *catchUpLimits, p int32, end int64) (kept bool, err error) {
	mark, ok, err := rs.store.TakeReleased(p)
	if err != nil {
		return false, err
	}
	released := mark.End
	if ok && released == end {
		return true, nil
	}
	if ok && released < end {
		if why := rs.canCatchUp(ctx, cl, limits, p, mark); why == "" {
			rs.log.Info("the partition comes back soon after this instance released it: its local state is caught up from the changelog",
				"topic", rs.topic, "partition", p, "released_at", released, "end", end, "released_ago", time.Since(mark.At).Round(time.Millisecond))
			return true, nil
		} else if !mark.At.IsZero() {
			rs.log.Info("the partition's local state is not caught up from its release mark", "topic", rs.topic, "partition", p, "why", why)
		}
		ours, err := rs.ownWritesOnly(ctx, cl, p, released, end)
		if err != nil {
			rs.log.Warn("could not tell who wrote the changelog since this instance released the partition; restoring it from the changelog's start",
				"topic", rs.topic, "partition", p, "released_at", released, "end", end, "err", err)
		}
		if ours {
			rs.log.Info("the changelog moved since the release only with this instance's writes; local state kept",
				"topic", rs.topic, "partition", p, "released_at", released, "end", end)
			return true, nil
		}
	}
	had, err := rs.store.WipePartition(p)
	if err != nil {
		return false, err
	}
	if had || ok {
		rs.log.Info("local state of the partition dropped: the partition was not held continuously; restoring it from the changelog's start",
			"topic", rs.topic, "partition", p, "had_tasks", had, "released_at", released, "end", end, "released", ok)
	}
	return false, nil
}

// catchUpLimits are what tells whether a partition can be caught up from
// its release mark (canCatchUp), listed once per restore, when a partition
// first needs them.
type catchUpLimits struct {
	listed    bool
	retention time.Duration      // the changelog's delete.retention.ms
	starts    kadm.ListedOffsets // its partitions' log start offsets
	err       error
}

// canCatchUp tells whether the local state of partition p, which this
// instance released at mark and another instance may have written since,
// can be brought up to the changelog by applying the records from the
// partition's checkpoint: it returns "" if so, else why not.
//
// The local state is the changelog up to the checkpoint, as this instance
// held it when it let the partition go: the mark is written after the last
// batch's write, and the checkpoint is still the one it recorded (see
// store.Release: a process killed after it took the partition back may
// leave the mark over state it wrote since). Compaction
// keeps each task's last record; what it can take away from the records
// after the checkpoint is a task's earlier records (its last one is read)
// and a tombstone, delete.retention.ms after the cleaner first passed it
// (KIP-534): a task deleted since the release would then stay in the
// local copy. Every record after the checkpoint was written at most a
// batch before the mark, so none of their tombstones can be gone while
// the mark is younger than delete.retention.ms; it must be younger than
// half of it, a margin for the clocks (this machine's measures the mark's
// age, the broker's the tombstone's). A changelog whose log start is not 0
// is not caught up from: retention or DeleteRecords deleted records from
// it, perhaps a task's only one, before the checkpoint as well as after, and
// the local copy would keep that task (compaction never moves the log start;
// the router's changelog is compacted only).
func (rs *Restorer) canCatchUp(ctx context.Context, cl *kgo.Client, limits *catchUpLimits, p int32, mark store.Release) string {
	if mark.At.IsZero() {
		return "the release mark has no time (written by an earlier release)"
	}
	// the local conditions first: the broker is asked only if they hold
	next, ok, err := rs.store.Checkpoint(p)
	if err != nil || !ok {
		return fmt.Sprintf("no checkpoint (%v)", err)
	}
	if next != mark.Checkpoint {
		// a process that took the partition back after the mark wrote to
		// the store and was killed before the mark's deletion was flushed
		return fmt.Sprintf("the store was written after the mark (checkpoint %d, %d at the mark)", next, mark.Checkpoint)
	}
	if !limits.listed {
		limits.listed = true
		limits.retention, limits.starts, limits.err = rs.listCatchUpLimits(ctx, cl)
	}
	if limits.err != nil {
		return fmt.Sprintf("the changelog's delete.retention.ms or log start unknown: %v", limits.err)
	}
	age := time.Since(mark.At)
	if age < 0 || age >= limits.retention/2 {
		return fmt.Sprintf("released %s ago, not within half of the changelog's delete.retention.ms (%s): a tombstone written since may be gone",
			age.Round(time.Millisecond), limits.retention)
	}
	start, ok := limits.starts.Lookup(rs.topic, p)
	if !ok || start.Err != nil {
		return fmt.Sprintf("the log start of the partition unknown (%v)", start.Err)
	}
	if start.Offset > 0 {
		return fmt.Sprintf("the changelog partition starts at %d: records were deleted from it", start.Offset)
	}
	return ""
}

// listCatchUpLimits lists the changelog's delete.retention.ms and its log
// start offsets, at once.
func (rs *Restorer) listCatchUpLimits(ctx context.Context, cl *kgo.Client) (time.Duration, kadm.ListedOffsets, error) {
	adm := kadm.NewClient(cl)
	var starts kadm.ListedOffsets
	var startsErr error
	listed := make(chan struct{})
	go func() {
		defer close(listed)
		starts, startsErr = adm.ListStartOffsets(ctx, rs.topic)
	}()
	retention, err := deleteRetention(ctx, adm, rs.topic)
	<-listed
	if err == nil {
		err = startsErr
	}
	return retention, starts, err
}

// deleteRetention returns the delete.retention.ms in effect for topic.
func deleteRetention(ctx context.Context, adm *kadm.Client, topic string) (time.Duration, error) {
	rcs, err := adm.DescribeTopicConfigs(ctx, topic)
	if err != nil {
		return 0, err
	}
	rc, err := rcs.On(topic, nil)
	if err != nil {
		return 0, err
	}
	if rc.Err != nil {
		return 0, rc.Err
	}
	for _, c := range rc.Configs {
		if c.Key == "delete.retention.ms" && c.Value != nil {
			ms, err := strconv.ParseInt(*c.Value, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("delete.retention.ms %q: %w", *c.Value, err)
			}
			return time.Duration(ms) * time.Millisecond, nil
		}
	}
	return 0, errors.New("delete.retention.ms not described")
}

// ownWritesOnly reports whether every committed record of changelog
// partition p in [from, end) was written by this instance's transactional
// producer: its transactional ID is stable, and so is the producer ID the
// broker keeps for it. Such records are a batch that was in flight when
// the partition was released (franz-go's revoke does not end a transaction
// already being produced); an aborted one leaves none.
func (rs *Restorer) ownWritesOnly(ctx context.Context, cl *kgo.Client, p int32, from, end int64) (bool, error) {
	pid, _, err := cl.ProducerID(ctx)
	if err != nil {
		return false, err
	}
	ranges := scan.Ranges{}
	ranges.Set(rs.topic, p, scan.Range{Start: from, End: end})
	ours := true
	err = scan.Read(ctx, rs.clientOpts, ranges, func(b *scan.Batch) error {
		for _, rec := range b.Records {
			if rec.ProducerID != pid {
				ours = false
				return scan.Stop
			}
		}
		return nil
	})
	if err != nil {
		return false, err
	}
	return ours, nil
}

// MarkReleased records, for each partition, the committed end of its
// changelog as this instance lets it go (a batch of its own may still be in
// flight: see trustOrWipe). It is bounded: on failure no mark is written,
// and the partition is restored from the changelog's start when it comes
// back.
func (rs *Restorer) MarkReleased(ctx context.Context, cl *kgo.Client, parts []int32) {
	if len(parts) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	adm := kadm.NewClient(cl)
	// the time is taken before the listing: every record past the mark is
	// written after it, but for this instance's own batch in flight
	now := time.Now()
	stable, err := adm.ListCommittedOffsets(ctx, rs.topic)
	if err == nil {
		for _, p := range parts {
			s, ok := stable.Lookup(rs.topic, p)
			if !ok || s.Err != nil {
				continue // unknown: no mark
			}
			cp, has, err := rs.store.Checkpoint(p)
			if err != nil || !has {
				cp = -1
			}
			if err := rs.store.SetReleased(p, store.Release{End: s.Offset, At: now, Checkpoint: cp}); err != nil {
				rs.log.Warn("release mark not written; the partition is restored from the changelog's start when it comes back", "partition", p, "err", err)
			}
		}
	}
	if err != nil {
		rs.log.Warn("changelog end unknown at release; the partitions are restored from the changelog's start when they come back", "partitions", parts, "err", err)
	}
}

// writerSchema names the writer schema of an encoded state by the
// fingerprint in its single-object header, for an error about the record.
func writerSchema(v []byte) string {
	fp, ok := codec.SingleObjectFingerprint(v)
	if !ok {
		return fmt.Sprintf("no Avro single-object header (first bytes % x)", v[:min(len(v), 10)])
	}
	return fmt.Sprintf("writer schema fingerprint %016x", fp)
}
