package hold

// breakertable.go shares the breakers between router instances and across
// restarts, the way Kafka Streams reads a global table. A goroutine reads
// the compacted breakers topic (one partition, read_committed) from its
// start: the router joins its group only once it has read to the end, and
// then follows it. The topic holds three kinds of records, and the table
// reads each in the topic's offset order; no writer's clock is compared:
//
//   - latch items, keyed "item/<scope>/<task>/<key>" (event.BreakerItem, a
//     tombstone once decided), and RESET records, keyed "reset/<scope>/<key>"
//     (a person's reset): the authority for latches. A breaker is latched
//     exactly while one of its items is open whose offset is above the
//     offset of its last RESET (internal/latch keeps that book). Every
//     hallucination writes its item, on whichever instance routes it,
//     latched there or not; `faultrouter breaker latch` writes one by hand.
//   - failure-rate breaker states, keyed "<scope>/<key>" (event.BreakerState,
//     OPEN or HALF_OPEN; a tombstone for CLOSED): derived, shared so that a
//     breaker that opens anywhere holds retries everywhere. The latest by
//     offset wins. Compaction may remove any of them without changing a
//     latch, and a latched breaker ignores them.
//
// What the reader reads waits in the table until the run loop applies it
// at the start of its next batch (adoptShared), since a breaker.Set is not
// safe for concurrent use. This instance's own records are in its breakers
// already: from the commit of the batch that wrote them until the reader
// reads them back, the table keeps them apart (mine), so that a state
// another instance wrote before them (a lower offset) is not applied over
// them, and so that the batches between see their own items.

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/latch"
	"github.com/faultrouter/faultrouter/internal/scan"
	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// breakerTable is the reader of the breakers topic, and the latches read.
// Without a topic (topic empty) it holds this instance's own latches only,
// applied as they commit.
type breakerTable struct {
	topic string
	self  string // this instance's ID
	log   *slog.Logger

	mu   sync.Mutex
	book *latch.Book
	// resets are the last RESET record of each breaker, for its reason
	resets map[breaker.Ref]event.BreakerState
	// pending are the failure-rate states read and not applied yet, the
	// latest of each breaker, with their place in the order read
	pending map[breaker.Ref]pendingState
	seq     uint64
	// latest is the latest failure-rate state of each breaker read, in
	// the topic's order, whoever wrote it (a RESET or a tombstone removes
	// it): what a breaker returns to when its latch ends (syncLatch)
	latest map[breaker.Ref]event.BreakerState
	// overRead are the breakers whose last RESET was read over a live
	// failure-rate state record (OPEN or HALF_OPEN) of theirs, with no state
	// record read after it: the RESET is what ends that record, so it may
	// not be tombstoned before the state's key has a newer record (tidy)
	overRead map[breaker.Ref]bool
	// legacyParts: the topic has partitions other than 0, where an earlier
	// release wrote by key. Then stateAt keeps, per breaker, the offset of
	// the last failure-rate state, tombstone or RESET read on partition 0:
	// an earlier release's state of the breaker read after it (another
	// partition, read in whatever order the fetches bring) is older in the
	// topic's order, and is not applied over it. One offset per breaker
	// ever shared, kept only where an earlier release may have written.
	legacyParts bool
	stateAt     map[breaker.Ref]int64
	// legacyLive are the breakers whose last record an earlier release
	// wrote to another partition is a live OPEN or HALF_OPEN, with that
	// partition: compaction keeps it there for ever, and a restart reads
	// it again once partition 0's newer records of the breaker are gone,
	// so this release's CLOSED of the breaker tombstones it there too
	// (share)
	legacyLive map[breaker.Ref]int32
	// mine are this instance's own item records committed and not read
	// back yet, by key; mineStates and mineResets count its own breaker
	// states and RESET tombstones committed and not read back, by breaker
	// (a count below zero: read back before the commit was told)
	mine       map[string]*mineItem
	mineStates map[breaker.Ref]int
	mineResets map[breaker.Ref]int
	local      int64 // without a topic: the offset of the next own record

	done   bool          // the initial read reached the end (under mu)
	loaded chan struct{} // closed then
	// read is, per partition, the offset after the last record the
	// table has read (control records included), under mu
	read map[int32]int64
	// target is what the latest assignment waits for the table to read
	// (catchUp): the last stable offsets listed after it; nil while they
	// are not known yet. targetGen counts the assignments.
	target    map[int32]int64
	targetGen uint64
	// listings are the last stable offsets listed (ListEvery) that the
	// table has not read to yet, oldest first; freshAt is when the latest
	// listing it has read to was taken (fresh)
	listings []listing
	freshAt  time.Time
	// stopped is closed when the reader has stopped (the router stops)
	stopped chan struct{}
}

// mineItem is an item record of this instance's committed and not read
// back: the breaker, the task, whether it opens or ends the item, and how
// many such records are in flight.
type mineItem struct {
	ref  breaker.Ref
	task string
	open bool
	n    int
}

// listing is the breakers topic's last stable offsets (ends), listed at
// at: every record committed before at lies below them.
type listing struct {
	at   time.Time
	ends map[int32]int64
}

// pendingState is a failure-rate state read and not applied yet, with its
// breaker and its place in the order read.
type pendingState struct {
	event.BreakerState
	ref breaker.Ref
	seq uint64
	// resetAt is the offset of the RESET record a RESET's state (Reset)
	// comes from
	resetAt int64
}

func newBreakerTable(topic, self string, log *slog.Logger) *breakerTable {
	t := &breakerTable{topic: topic, self: self, log: log, book: latch.New(), resets: map[breaker.Ref]event.BreakerState{},
		pending: map[breaker.Ref]pendingState{}, latest: map[breaker.Ref]event.BreakerState{}, overRead: map[breaker.Ref]bool{}, stateAt: map[breaker.Ref]int64{}, legacyLive: map[breaker.Ref]int32{}, mine: map[string]*mineItem{}, mineStates: map[breaker.Ref]int{},
		mineResets: map[breaker.Ref]int{}, loaded: make(chan struct{}), read: map[int32]int64{}, stopped: make(chan struct{})}
	if topic == "" {
		t.done = true
		close(t.loaded)
		close(t.stopped)
	}
	return t
}

// run reads the topic until ctx ends, after an error from where it had
// read to (every record's effect is ordered by its offset, so a record
// read twice changes nothing).
func (t *breakerTable) run(ctx context.Context, clientOpts []kgo.Opt) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := t.follow(ctx, clientOpts)
		if ctx.Err() != nil {
			return
		}
		t.log.Warn("reading the breakers topic failed; reading on from where it stopped", "topic", t.topic, "err", err, "backoff", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// follow reads the topic from where the table has read to (its start, the
// first time): to the last stable offsets it had when it started (then the
// table is loaded), and on while ctx lasts.
func (t *breakerTable) follow(ctx context.Context, clientOpts []kgo.Opt) error {
	adm, err := kgo.NewClient(clientOpts...)
	if err != nil {
		return err
	}
	at := time.Now()
	ranges, err := scan.Committed(ctx, kadm.NewClient(adm), t.topic)
	adm.Close()
	if err != nil {
		return err
	}
	t.listed(at, rangeEnds(ranges[t.topic]))
	t.mu.Lock()
	t.legacyParts = t.legacyParts || len(ranges[t.topic]) > 1
	t.mu.Unlock()
	// every partition, from where the table has read it to (its start, the
	// first time)
	from := map[int32]kgo.Offset{}
	t.mu.Lock()
	for p := range ranges[t.topic] {
		if n, ok := t.read[p]; ok {
			from[p] = kgo.NewOffset().At(n)
		} else {
			from[p] = kgo.NewOffset().AtStart()
		}
	}
	t.mu.Unlock()
	cl, err := kgo.NewClient(append(append([]kgo.Opt{}, clientOpts...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{t.topic: from}),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), // an offset the cleaner removed: the next one kept
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(), // a transaction's marker may be the last offset before the end
		// a fetch parked on an idle topic answers within a listing's
		// period, so the table reaches each listing soon (FreshFor)
		kgo.FetchMaxWait(ListEvery),
	)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	for {
		t.mu.Lock()
		if !t.done && !t.behind(rangeEnds(ranges[t.topic])) {
			t.done = true
			close(t.loaded)
		}
		t.mu.Unlock()
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if BeforeTableFetch != nil {
			BeforeTableFetch()
		}
		var ferr error
		fetches.EachError(func(_ string, _ int32, err error) { ferr = err })
		if ferr != nil {
			return ferr
		}
		// a fetch is applied whole: a batch never takes a RESET without the
		// item written after it in the same fetch
		t.mu.Lock()
		fetches.EachRecord(func(rec *kgo.Record) {
			t.read[rec.Partition] = max(t.read[rec.Partition], rec.Offset+1)
			if !rec.Attrs.IsControl() {
				t.apply(rec)
			}
		})
		t.reach()
		t.mu.Unlock()
	}
}

// BeforeTableFetch, in tests, runs before the table handles each fetch: a
// test holds the table back with it. Nil in production.
var BeforeTableFetch func()

func rangeEnds(rs map[int32]scan.Range) map[int32]int64 {
	out := make(map[int32]int64, len(rs))
	for p, r := range rs {
		if r.End > r.Start {
			out[p] = r.End
		}
	}
	return out
}

// behind reports whether the table has not read some partition up to its
// offset in ends; under mu.
func (t *breakerTable) behind(ends map[int32]int64) bool {
	for p, end := range ends {
		if t.read[p] < end {
			return true
		}
	}
	return false
}

// legacy moves the offsets of the breakers topic's partitions other than 0
// (`run --partitions` gives it several, as earlier releases expect, which
// wrote there by key) before every offset of partition 0, the only one
// written now (besides the tombstones of an earlier release's states,
// tombstoneLegacy), whose offsets order every record.
const legacy = int64(1) << 62

// apply reads one record of the topic (under mu).
func (t *breakerTable) apply(rec *kgo.Record) {
	if rec.Partition != 0 {
		c := *rec
		c.Offset -= legacy
		rec = &c
	}
	key := string(rec.Key)
	writer := codec.ParseBreakerHeaders(rec.Headers).Instance
	switch {
	case strings.HasPrefix(key, event.BreakerItemPrefix):
		t.applyItem(rec, key, writer)
	case strings.HasPrefix(key, event.BreakerResetPrefix):
		t.applyReset(rec, key, writer)
	default:
		t.applyState(rec, key, writer)
	}
}

func (t *breakerTable) applyItem(rec *kgo.Record, key, writer string) {
	var it event.BreakerItem
	if rec.Value != nil {
		var err error
		if it, err = event.DecodeBreakerItem(rec.Value); err != nil {
			t.log.Warn("breakers topic: a record that is not a latch item is skipped", "partition", rec.Partition, "offset", rec.Offset, "err", err)
			return
		}
		if writer == "" {
			writer = it.Instance
		}
	}
	if writer == t.self && t.done {
		t.readBack(key)
	}
	if rec.Value == nil {
		end := rec.Offset
		if end < 0 {
			// an earlier release's decision of the item, written by key to
			// another partition: it came after the item, whatever partition
			// the item is on
			end = math.MaxInt64
		}
		t.book.End(key, end)
		return
	}
	sc, err := breaker.ParseScope(it.Scope)
	if err != nil {
		t.log.Warn("breakers topic: a latch item of an unknown scope is skipped", "task_id", it.TaskID, "scope", it.Scope, "key", it.Key)
		return
	}
	t.book.Open(key, latch.Item{Key: key, Ref: breaker.Ref{Scope: sc, Key: it.Key}, Task: it.TaskID, Offset: rec.Offset, Writer: writer})
}

// readBack counts one of this instance's item records under key read back.
func (t *breakerTable) readBack(key string) {
	m := t.mine[key]
	if m == nil {
		m = &mineItem{}
		t.mine[key] = m
	}
	if m.n--; m.n == 0 {
		delete(t.mine, key)
	}
}

func (t *breakerTable) applyReset(rec *kgo.Record, key, writer string) {
	sc, k, ok := event.ParseBreakerKey(strings.TrimPrefix(key, event.BreakerResetPrefix))
	scope, err := breaker.ParseScope(sc)
	if !ok || err != nil {
		t.log.Warn("breakers topic: a RESET of an unknown breaker is skipped", "partition", rec.Partition, "offset", rec.Offset, "key", key)
		return
	}
	ref := breaker.Ref{Scope: scope, Key: k}
	if rec.Value == nil { // no item before it is open any more
		if writer == t.self && t.done {
			t.mineResets[ref]--
		}
		// the tombstone names the RESET it removes: a newer one, read
		// before it, stays (an earlier release names none)
		if h := codec.ParseBreakerHeaders(rec.Headers); h.ResetNamed {
			if r, ok := t.book.ResetOffset(ref); ok && r != h.ResetOffset {
				return
			}
		}
		t.book.ForgetReset(ref)
		delete(t.resets, ref)
		delete(t.overRead, ref)
		return
	}
	s, err := event.DecodeBreakerState(rec.Value)
	if err != nil || !s.Reset {
		t.log.Warn("breakers topic: a record that is not a RESET is skipped", "partition", rec.Partition, "offset", rec.Offset, "key", key, "err", err)
		return
	}
	t.book.Reset(ref, rec.Offset)
	if r, _ := t.book.ResetOffset(ref); r == rec.Offset { // not an older one read late
		t.resets[ref] = s
	}
	if !t.stateRead(ref, rec.Offset) {
		// an earlier release's RESET read after a newer state of partition
		// 0: the book orders it among the items; the state stands
		return
	}
	if _, live := t.latest[ref]; live {
		t.overRead[ref] = true
	}
	delete(t.latest, ref)
	// it also closes the breaker's failure-rate state, in the topic's
	// order, also over this instance's own changes not read back yet: they
	// come after it in the topic and were derived before it (stale)
	t.seq++
	t.pending[ref] = pendingState{BreakerState: s, ref: ref, seq: t.seq, resetAt: rec.Offset}
}

func (t *breakerTable) applyState(rec *kgo.Record, key, writer string) {
	var s event.BreakerState
	if rec.Value == nil { // a breaker closed
		sc, k, ok := event.ParseBreakerKey(key)
		if !ok {
			return
		}
		s = event.BreakerState{Scope: sc, Key: k, State: breaker.Closed.Name(), Reason: "closed", Instance: writer}
	} else {
		var err error
		if s, err = event.DecodeBreakerState(rec.Value); err != nil {
			t.log.Warn("breakers topic: a record that is not a breaker state is skipped", "partition", rec.Partition, "offset", rec.Offset, "err", err)
			return
		}
		// a latch is never a state (an earlier release wrote latched
		// states and RESETs under the breaker's key): it counts as the
		// failure-rate state it shows
		s.Latched, s.Reset = false, false
	}
	sc, err := breaker.ParseScope(s.Scope)
	if err != nil {
		t.log.Warn("breakers topic: a breaker state of an unknown scope is skipped", "scope", s.Scope, "key", s.Key)
		return
	}
	ref := breaker.Ref{Scope: sc, Key: s.Key}
	if rec.Offset < 0 { // an earlier release's, on partition rec.Partition
		if rec.Value != nil && s.State != breaker.Closed.Name() {
			t.legacyLive[ref] = rec.Partition
		} else if p, ok := t.legacyLive[ref]; ok && p == rec.Partition {
			delete(t.legacyLive, ref)
		}
	}
	if !t.stateRead(ref, rec.Offset) {
		// an earlier release's state, read after a newer one of partition
		// 0: what it said was changed since
		return
	}
	if h := codec.ParseBreakerHeaders(rec.Headers); h.AfterResetKnown {
		if r, reset := t.book.ResetOffset(ref); reset && h.AfterReset < r {
			// derived before the breaker's last RESET, which it comes
			// after in the topic (an OPEN whose cooldown ended on its
			// writer as a person reset it): the RESET stands, and the
			// state's key gets a tombstone before the RESET goes (tidy)
			if s.Instance == t.self && t.done {
				t.mineStates[ref]--
			}
			t.overRead[ref] = true
			t.book.MarkDirty(ref)
			return
		}
	}
	if t.overRead[ref] { // the key's last record is newer than the RESET
		delete(t.overRead, ref)
		t.book.MarkDirty(ref) // which may go now (tidy)
	}
	if rec.Value == nil {
		delete(t.latest, ref)
	} else {
		t.latest[ref] = s
	}
	if s.Instance == t.self && t.done {
		// this instance's own change, in its breakers already; what
		// others wrote before it is older
		t.mineStates[ref]--
		delete(t.pending, ref)
		return
	}
	t.keep(s, ref)
}

// stateRead records a failure-rate state, tombstone or RESET of ref read at
// offset (an earlier release's below zero), and reports whether it is the
// latest of ref in the topic's order: false for an earlier release's record
// read after one of partition 0 (under mu).
func (t *breakerTable) stateRead(ref breaker.Ref, offset int64) bool {
	if !t.legacyParts {
		return true
	}
	if last, ok := t.stateAt[ref]; ok && offset < last {
		return false
	}
	if offset >= 0 {
		t.stateAt[ref] = offset
	}
	return true
}

// keep keeps s as the latest failure-rate state of ref not applied yet,
// unless a change of this instance's own to ref, written after it, is not
// read back yet (under mu).
func (t *breakerTable) keep(s event.BreakerState, ref breaker.Ref) {
	if t.mineStates[ref] > 0 {
		return
	}
	t.seq++
	t.pending[ref] = pendingState{BreakerState: s, ref: ref, seq: t.seq}
}

// wrote records what a batch of this instance's wrote to the topic, once
// its transaction has committed: its items (opened or ended), the
// breakers whose state it shared and the RESETs it tombstoned. Every state
// another instance wrote and the table read by now is older than these.
func (t *breakerTable) wrote(items map[string]batchItem, states map[breaker.Ref]int, resets map[breaker.Ref]bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for key, it := range items {
		if t.topic == "" { // no reader: applied as written
			t.local++
			if it.open {
				t.book.Open(key, latch.Item{Key: key, Ref: it.ref, Task: it.task, Offset: t.local, Writer: t.self})
			} else {
				t.book.End(key, t.local)
			}
			continue
		}
		m := t.mine[key]
		if m == nil {
			m = &mineItem{}
			t.mine[key] = m
		}
		m.ref, m.task, m.open = it.ref, it.task, it.open
		if m.n++; m.n == 0 {
			delete(t.mine, key)
		}
	}
	if t.topic == "" {
		return
	}
	for ref, n := range states {
		// n records, counted as they are read back (applyState): a
		// count still above zero is a change of this instance's in flight,
		// newer than what was read of the breaker; one at zero or below
		// was read back already, and what was read after it is newer
		t.mineStates[ref] += n
		switch c := t.mineStates[ref]; {
		case c == 0:
			delete(t.mineStates, ref)
		case c > 0:
			delete(t.pending, ref)
		}
	}
	for ref := range resets {
		t.mineResets[ref]++
		if t.mineResets[ref] == 0 {
			delete(t.mineResets, ref)
		}
	}
}

// localReset applies a person's reset without a topic: this instance's
// breakers are its own.
func (t *breakerTable) localReset(ref breaker.Ref, s event.BreakerState) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.local++
	t.book.Reset(ref, t.local)
	t.resets[ref] = s
}

// holding appends to out the tasks of the items that hold ref latched:
// those read above its last RESET, and this instance's own not read back
// yet (those that end an item count over the item read; those that open one
// hold, whatever their offset turns out to be). Under mu.
func (t *breakerTable) holding(ref breaker.Ref, out []latch.Item) []latch.Item {
	for _, it := range t.book.Holding(ref) {
		if m := t.mine[it.Key]; m != nil && m.n > 0 {
			continue
		}
		out = append(out, it)
	}
	for key, m := range t.mine {
		if m.n > 0 && m.open && m.ref == ref {
			out = append(out, latch.Item{Key: key, Ref: ref, Task: m.task, Offset: -1, Writer: t.self})
		}
	}
	return out
}

// itemOpen reports whether the item under key is open: read and not ended,
// or opened by this instance and not read back.
func (t *breakerTable) itemOpen(key []byte) bool {
	if m := t.mine[string(key)]; m != nil && m.n > 0 {
		return m.open
	}
	return t.book.HasItem(key)
}

// changes returns, and forgets, the failure-rate states not applied yet in
// the order read, and the breakers whose latch may have changed.
func (t *breakerTable) changes() ([]pendingState, []breaker.Ref) {
	t.mu.Lock()
	defer t.mu.Unlock()
	dirty := t.book.Dirty()
	if len(t.pending) == 0 {
		return nil, dirty
	}
	out := slices.Collect(maps.Values(t.pending))
	clear(t.pending)
	slices.SortFunc(out, func(x, y pendingState) int { return cmp.Compare(x.seq, y.seq) })
	return out, dirty
}

// giveBack returns the states of a batch that did not commit, each unless
// one of its breaker read later, or a change of this instance's own, came
// meanwhile.
func (t *breakerTable) giveBack(p []pendingState) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, s := range p {
		if cur, ok := t.pending[s.ref]; (!ok || cur.seq < s.seq) && (s.Reset || t.mineStates[s.ref] <= 0) {
			t.pending[s.ref] = s
		}
	}
}

// dirtyAgain marks refs for the next batch's latch check (a batch that did
// not commit checked them).
func (t *breakerTable) dirtyAgain(refs []breaker.Ref) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, ref := range refs {
		t.book.MarkDirty(ref)
	}
}

// retarget begins a new wait (an assignment, or a batch after a gap):
// no retry is published until its target is set (setTarget) and read. It
// returns the wait's number.
func (t *breakerTable) retarget() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.targetGen++
	t.target = nil
	return t.targetGen
}

// setTarget makes ends what the table must read before the assignment
// numbered gen may publish retries (current).
func (t *breakerTable) setTarget(gen uint64, ends map[int32]int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if gen == t.targetGen {
		t.target = ends
	}
}

// current reports whether the table has read what the latest assignment
// waits for.
func (t *breakerTable) current() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.topic == "" || t.target != nil && !t.behind(t.target)
}

// StartTable starts reading the breakers topic and waits until it is read
// to its end, so that the router joins its group (and reports ready) only
// with every instance's breakers in hand. Without a breakers topic
// (Topics.Breakers empty) breakers are this instance's own.
func (k *Breakers) StartTable(ctx context.Context, clientOpts []kgo.Opt) error {
	t := k.table
	if t.topic == "" {
		return nil
	}
	go func() {
		defer close(t.stopped)
		t.run(ctx, clientOpts)
	}()
	go t.list(ctx, clientOpts)
	select {
	case <-t.loaded:
		k.log.Info("breakers topic read to its end", "topic", t.topic)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TableCatchUp is how long an assignment waits for the breakers table to
// read what was committed before it, before the assignment callback
// returns; the assignment publishes no retry until the table has, however
// long that takes (current).
const TableCatchUp = 10 * time.Second

// CatchUpTable runs when an assignment begins (onAssigned): it lists the
// breakers topic's last stable offsets, and no retry is published until the
// table has read up to them (current), so the assignment's batches decide
// on every latch and breaker state committed before it. It waits for that
// for up to TableCatchUp. When the offsets cannot be listed it lists them
// again in the background until it can: publication waits meanwhile.
func (k *Breakers) CatchUpTable(ctx context.Context, cl *kgo.Client) {
	t := k.table
	if t.topic == "" {
		return
	}
	gen := t.retarget()
	began := time.Now()
	adm := kadm.NewClient(cl)
	list := func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, TableCatchUp)
		defer cancel()
		ranges, err := scan.Committed(ctx, adm, t.topic)
		if err == nil {
			t.setTarget(gen, rangeEnds(ranges[t.topic]))
		}
		return err
	}
	if err := list(ctx); err != nil {
		k.log.Warn("breakers topic: could not list its last stable offsets; no retry is published until it is read to them", "topic", t.topic, "err", err)
		go func() {
			for ctx.Err() == nil {
				select {
				case <-ctx.Done():
					return
				case <-t.stopped:
					return
				case <-time.After(time.Second):
				}
				t.mu.Lock()
				stale := gen != t.targetGen
				t.mu.Unlock()
				if stale || list(ctx) == nil {
					return
				}
			}
		}()
		return
	}
	wait, cancel := context.WithTimeout(ctx, TableCatchUp)
	defer cancel()
	for !t.current() {
		select {
		case <-wait.Done():
			k.log.Warn("breakers topic: not read to its end in time; the assignment publishes no retry until it is", "topic", t.topic, "waited", TableCatchUp)
			return
		case <-t.stopped:
			return // the router is stopping: the assignment will not route
		case <-time.After(5 * time.Millisecond):
		}
	}
	k.log.Info("breakers topic read to its end for the assignment", "topic", t.topic, "took", time.Since(began).Round(time.Millisecond))
}

// A batch publishes retries only with a table fresh enough that no
// breaker state or latch item committed more than FreshFor before the
// batch began is missing from it: the latest listing of the topic's last
// stable offsets that the table had read to when the batch adopted what it
// read (adoptShared) was taken at most FreshFor before. A goroutine lists
// them every ListEvery. So a latch, or an OPEN, committed anywhere holds
// every instance's retries at most FreshFor (and a batch) after its
// commit, whatever held the table back: a reader waiting out a broker
// restart, a process paused or starved of CPU. While the table is not
// that fresh the due retries wait, as during an assignment's catch-up.
const (
	ListEvery = 500 * time.Millisecond
	FreshFor  = 2 * time.Second
)

// listed records a listing of the topic's last stable offsets taken at at
// (under no lock), and what the table has read of it.
func (t *breakerTable) listed(at time.Time, ends map[int32]int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.listings) == maxListings {
		// a reader held back: forgetting the oldest only makes the table
		// fresh later
		t.listings = slices.Delete(t.listings, 0, 1)
	}
	t.listings = append(t.listings, listing{at: at, ends: ends})
	t.reach()
}

// maxListings bounds the listings kept while the reader is behind them.
const maxListings = 16

// reach makes the listings the table has read to its freshness; under mu.
// Last stable offsets only grow, so they are read to in the order listed.
func (t *breakerTable) reach() {
	n := 0
	for n < len(t.listings) && !t.behind(t.listings[n].ends) {
		if t.listings[n].at.After(t.freshAt) {
			t.freshAt = t.listings[n].at
		}
		n++
	}
	t.listings = slices.Delete(t.listings, 0, n)
}

// freshness is when the latest listing the table has read to was taken.
func (t *breakerTable) freshness() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.freshAt
}

// list lists the topic's last stable offsets every ListEvery until ctx
// ends (listed). A listing that fails is tried again at the next one.
func (t *breakerTable) list(ctx context.Context, clientOpts []kgo.Opt) {
	cl, err := kgo.NewClient(clientOpts...)
	if err != nil {
		t.log.Error("breakers topic: cannot list its offsets; no retry is published", "topic", t.topic, "err", err)
		return
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(ListEvery):
		}
		at := time.Now()
		lctx, cancel := context.WithTimeout(ctx, TableCatchUp)
		ranges, err := scan.Committed(lctx, adm, t.topic)
		cancel()
		switch {
		case err != nil && ctx.Err() != nil:
			return
		case err != nil && !failing:
			failing = true
			t.log.Warn("breakers topic: cannot list its last stable offsets; retries wait until it can", "topic", t.topic, "err", err)
		case err == nil:
			if failing {
				failing = false
				t.log.Info("breakers topic: its last stable offsets are listed again", "topic", t.topic)
			}
			t.listed(at, rangeEnds(ranges[t.topic]))
		}
	}
}

// AdoptShared applies, at the start of a batch (after begin), and again
// when an assignment came during the batch before it publishes retries,
// what the table read since: the failure-rate states other instances
// wrote, in the order written, and the latches of the breakers whose items
// or RESETs changed. It queues the transitions they cause on the alerts
// topic, with the reason "adopted from <instance>: <its reason>" (or what
// latched or released it), and the tombstones of the items a RESET ended
// whose tasks this instance owns. A batch that does not commit gives the
// states back (rollback) with its other breaker changes.
func (k *Breakers) AdoptShared(out Out, now time.Time) {
	k.fresh = k.table.freshness() // before the changes: they include all it says
	fresh := k.tableFresh()
	if now.Sub(k.expired) >= expireEvery {
		k.expired = now
		k.transitions(k.set.Expire(now, func(ref breaker.Ref) bool {
			// an unused template is let go only with a fresh table, as
			// adopt releases one (holdsTemplate)
			return k.held.holds(ref) || !fresh && k.holdsTemplate(ref)
		}), out, now)
	}
	states, dirty := k.table.changes()
	// a template is released (OPEN or HALF_OPEN to CLOSED) by another
	// instance's CLOSED only with a fresh table, like a latch ends
	// (syncLatch): a table held back (its reader waiting out a broker
	// restart, this process paused) may not have read an item that latches
	// the template yet. The state waits in the table for a later batch,
	// unless a newer one of its breaker comes first.
	if !fresh {
		var wait []pendingState
		states = slices.DeleteFunc(states, func(s pendingState) bool {
			if s.State == breaker.Closed.Name() && k.holdsTemplate(s.ref) {
				wait = append(wait, s)
				return true
			}
			return false
		})
		k.table.giveBack(wait)
	}
	k.adopting = append(k.adopting, states...)
	k.checked = append(k.checked, dirty...)
	// latches first: a latched breaker ignores the states (a process that
	// starts adopts no OPEN or CLOSED of a template its items latch)
	var later []breaker.Ref
	for _, ref := range dirty {
		k.syncLatch(ref, out, now)
		// a tombstone is written only once the table is current: a
		// partition just assigned may have an item of the same task
		// written after the one a RESET ended, which this instance has
		// not read yet, and the tombstone would end that one
		if k.table.current() {
			k.tidy(ref, out, now)
		} else {
			later = append(later, ref)
		}
	}
	if len(later) > 0 {
		k.table.dirtyAgain(later)
	}
	for i := range states {
		if states[i].Reset {
			k.adoptedReset[states[i].ref] = states[i].resetAt
		}
		k.adopt(states[i].ref, &states[i].BreakerState, out, now)
	}
	k.gauges()
}

// holdsTemplate reports whether ref is a prompt template's breaker that is
// not CLOSED here: what an item elsewhere may latch.
func (k *Breakers) holdsTemplate(ref breaker.Ref) bool {
	return ref.Scope == breaker.PromptTemplate && k.set.State(ref) != breaker.Closed
}

// expireEvery is how often a batch lets go of the breakers not used for a
// while (breaker.Set.Expire).
const expireEvery = 10 * time.Second

// adopt applies one failure-rate state another instance wrote (or a
// person's RESET). A latched breaker keeps its latch: only its items and
// RESETs change that (syncLatch).
func (k *Breakers) adopt(ref breaker.Ref, s *event.BreakerState, out Out, now time.Time) {
	if k.set.Latched(ref) {
		return
	}
	sh := breaker.Shared{Elsewhere: s.Instance != k.instance}
	sh.State, _ = breaker.ParseState(s.State)
	if s.OpenedAt != nil {
		sh.OpenedAt = s.OpenedAt.Time
	}
	who := s.Instance
	if who == "" {
		who = "another instance"
	}
	reason := "adopted from " + who + ": " + s.Reason
	if s.Reset {
		reason = fmt.Sprintf("%s reset the breaker: %s", who, s.Reason)
	}
	k.transitionEventsFrom(k.set.Adopt(ref, sh, reason, now), out, who)
}

// holdingItems returns the items that hold ref latched in this batch: the
// table's (holding), and the batch's own.
func (k *Breakers) holdingItems(ref breaker.Ref) []latch.Item {
	t := k.table
	t.mu.Lock()
	its := t.holding(ref, k.itemScratch[:0])
	t.mu.Unlock()
	its = slices.DeleteFunc(its, func(it latch.Item) bool {
		_, mine := k.batch[it.Key]
		return mine
	})
	for key, it := range k.batch {
		if it.open && it.ref == ref {
			its = append(its, latch.Item{Key: key, Ref: ref, Task: it.task, Offset: -1, Writer: k.instance})
		}
	}
	k.itemScratch = its
	return its
}

// itemOpen reports whether task's item of ref is open in this batch. Its
// record key is built in a scratch buffer: every decided event with a prompt
// template asks.
func (k *Breakers) itemOpen(ref breaker.Ref, task string) bool {
	k.itemKey = event.AppendBreakerItemKey(k.itemKey[:0], ref.Scope.Name(), ref.Key, task)
	if it, ok := k.batch[string(k.itemKey)]; ok {
		return it.open
	}
	k.table.mu.Lock()
	defer k.table.mu.Unlock()
	return k.table.itemOpen(k.itemKey)
}

// syncLatch makes ref's breaker latched exactly while items hold it, and
// queues the transition: a latched OPEN, or the CLOSED of a person's reset
// or of its last item decided. A latch ends only with a fresh table
// (tableFresh); until then ref is asked again at the next batch.
func (k *Breakers) syncLatch(ref breaker.Ref, out Out, now time.Time) {
	its := k.holdingItems(ref)
	switch latched := k.set.Latched(ref); {
	case len(its) > 0 && !latched:
		it := its[0]
		reason := fmt.Sprintf("latched by task %s's item (%s): open until a person resets it", it.Task, it.Writer)
		if strings.HasPrefix(it.Task, "latch:") {
			reason = fmt.Sprintf("latched by hand (%s): open until a person resets it", it.Writer)
		}
		ts := k.set.Trip(ref, reason, breaker.Outcome{Class: string(event.ClassHallucination), TaskID: it.Task}, now)
		k.transitionEventsFrom(ts, out, it.Writer)
	case len(its) == 0 && latched:
		if !k.tableFresh() {
			k.table.dirtyAgain([]breaker.Ref{ref}) // asked again by a later batch
			return
		}
		k.table.mu.Lock()
		rs, reset := k.table.resets[ref]
		k.table.mu.Unlock()
		reason, who := "its last latch item was decided", ""
		if reset {
			who = rs.Instance
			reason = fmt.Sprintf("%s reset the breaker: %s", rs.Instance, rs.Reason)
		}
		ts, from := k.unlatch(ref, reason, now)
		k.transitionEventsFrom(ts, out, cmp.Or(from, who))
	}
}

// unlatch ends ref's latch and leaves the breaker in the failure-rate
// state shared for it, the latest the table read (none: CLOSED): an OPEN
// whose cooldown has not ended still holds retries, on every instance
// alike. It returns the transition (OPEN to OPEN when it stays open), and
// the other instance whose shared state it took ("" for none or this one).
func (k *Breakers) unlatch(ref breaker.Ref, reason string, now time.Time) ([]breaker.Transition, string) {
	k.table.mu.Lock()
	s, shared := k.table.latest[ref]
	k.table.mu.Unlock()
	var sh breaker.Shared
	if shared {
		sh.State, _ = breaker.ParseState(s.State)
		if s.OpenedAt != nil {
			sh.OpenedAt = s.OpenedAt.Time
		}
		sh.Elsewhere = s.Instance != k.instance
		if sh.State == breaker.HalfOpen && !sh.Elsewhere {
			// this instance's own probing, which the latch interrupted:
			// its probes were never published; it closes
			sh = breaker.Shared{}
		}
		if sh.State != breaker.Closed {
			reason += "; back to the " + sh.State.String() + " " + s.Instance + " shared: " + s.Reason
		}
	}
	ts := k.set.Unlatch(ref, sh, reason, now)
	from := ""
	if sh.State != breaker.Closed && sh.Elsewhere {
		from = s.Instance
	}
	return ts, from
}

// tidy writes, for a breaker whose latch changed, the tombstones of the
// items its last RESET ended whose tasks this instance owns, and the
// tombstone of a RESET no item needs any more, when this instance owns the
// breaker's partition: what the breakers topic keeps live of latches is
// then what holds one.
func (k *Breakers) tidy(ref breaker.Ref, out Out, now time.Time) {
	if k.topics.Breakers == "" {
		return
	}
	t := k.table
	t.mu.Lock()
	ended := t.book.Ended(ref)
	obsolete := t.book.Obsolete(ref) && t.mineResets[ref] <= 0
	overRead, sharing := t.overRead[ref], t.mineStates[ref] > 0
	resetAt, _ := t.book.ResetOffset(ref)
	for i, key := range ended {
		if m := t.mine[key]; m != nil && m.n > 0 {
			ended[i] = "" // its tombstone is on its way
		}
	}
	var tasks []string
	for _, key := range ended {
		if it, ok := t.book.Item(key); ok && key != "" {
			tasks = append(tasks, it.Task)
		}
	}
	t.mu.Unlock()
	owned := k.owner.OwnedSet()
	for _, task := range tasks {
		if _, done := k.batch[event.BreakerItemKey(ref.Scope.Name(), ref.Key, task)]; !done && owned[k.home([]byte(task))] {
			k.shareItem(ref, task, false, out, now)
		}
	}
	if obsolete && owned[k.home([]byte(ref.String()))] {
		if overRead {
			// the RESET ends a state record that compaction would keep
			// without it: the state's key gets its tombstone (CLOSED, as
			// the RESET left it) first, and the RESET goes once that is
			// read back
			if !sharing && k.shared[ref] == 0 {
				out.Queue(k.stateRecord(ref, now))
				k.tombstoneLegacy(ref, out, now)
			}
			return
		}
		if k.resetTombs == nil {
			k.resetTombs = map[breaker.Ref]bool{}
		}
		k.resetTombs[ref] = true
		out.Queue(&kgo.Record{Topic: k.topics.Breakers, Key: []byte(event.BreakerResetKey(ref.Scope.Name(), ref.Key)), Timestamp: now,
			Headers: []kgo.RecordHeader{{Key: codec.HeaderBreakerInstance, Value: []byte(k.instance)},
				{Key: codec.HeaderBreakerResetOffset, Value: []byte(strconv.FormatInt(resetAt, 10))}}})
	}
}

// share queues the failure-rate state of ref, as this instance's change,
// on the breakers topic in the batch's transaction: OPEN or HALF_OPEN, or
// the tombstone of a breaker that closed. A latched breaker's states are
// not shared: its items and RESETs are the record of it.
func (k *Breakers) share(ref breaker.Ref, reason string, out Out, now time.Time) {
	if k.topics.Breakers == "" {
		return
	}
	sh := k.set.Shared(ref)
	if sh.Latched {
		return
	}
	rec := k.stateRecord(ref, now)
	if sh.State != breaker.Closed {
		s := event.BreakerState{Scope: ref.Scope.Name(), Key: ref.Key, State: sh.State.Name(), Reason: reason,
			UpdatedAt: event.At(now), Instance: k.instance}
		if sh.State == breaker.Open {
			at := event.At(sh.OpenedAt)
			s.OpenedAt = &at
		}
		v, err := event.EncodeBreakerState(&s)
		if err != nil { // only a bug can get here: every field is the router's own
			k.log.Error("breaker state does not encode", "scope", s.Scope, "key", s.Key, "err", err)
			return
		}
		rec.Value = v
	}
	out.Queue(rec)
	if sh.State == breaker.Closed {
		k.tombstoneLegacy(ref, out, now)
	}
}

// tombstoneLegacy queues, with a CLOSED of ref, a tombstone of ref's key on
// the partition where an earlier release's OPEN or HALF_OPEN of it is the
// last record: compaction then removes that state, which a restart would
// otherwise read, once partition 0's records of the breaker are gone, and
// adopt. It names no instance: whoever reads it back takes it for a CLOSED
// an earlier release wrote, older than every record of partition 0.
func (k *Breakers) tombstoneLegacy(ref breaker.Ref, out Out, now time.Time) {
	k.table.mu.Lock()
	p, ok := k.table.legacyLive[ref]
	k.table.mu.Unlock()
	if ok {
		out.Queue(&kgo.Record{Topic: k.topics.Breakers, Partition: p, Key: []byte(event.BreakerStateKey(ref.Scope.Name(), ref.Key)), Timestamp: now})
	}
}

// stateRecord returns the record of ref's failure-rate state as this
// instance's change, a tombstone (CLOSED) until its value is set, and
// counts it among the batch's shared states.
func (k *Breakers) stateRecord(ref breaker.Ref, now time.Time) *kgo.Record {
	if k.shared == nil {
		k.shared = map[breaker.Ref]int{}
	}
	k.shared[ref]++ // a batch may change a breaker more than once: a record each
	after := int64(-1)
	if r, ok := k.adoptedReset[ref]; ok {
		after = r
	}
	return &kgo.Record{Topic: k.topics.Breakers, Key: []byte(event.BreakerStateKey(ref.Scope.Name(), ref.Key)), Timestamp: now,
		Headers: []kgo.RecordHeader{{Key: codec.HeaderBreakerInstance, Value: []byte(k.instance)},
			{Key: codec.HeaderBreakerAfterReset, Value: strconv.AppendInt(nil, after, 10)}}}
}

// batchItem is an item record a batch writes: it opens the item of task on
// ref, or ends it.
type batchItem struct {
	ref  breaker.Ref
	task string
	open bool
}

// shareItem queues, on the breakers topic in the batch's transaction, an
// open latch item of ref for the task (open), or its tombstone once
// decided; the batch counts it at once (holdingItems), the table once the
// batch commits.
func (k *Breakers) shareItem(ref breaker.Ref, taskID string, open bool, out Out, now time.Time) {
	key := event.BreakerItemKey(ref.Scope.Name(), ref.Key, taskID)
	if k.batch == nil {
		k.batch = map[string]batchItem{}
	}
	k.batch[key] = batchItem{ref: ref, task: strings.Clone(taskID), open: open}
	if k.topics.Breakers == "" {
		return
	}
	rec := &kgo.Record{Topic: k.topics.Breakers, Key: []byte(key), Timestamp: now,
		Headers: []kgo.RecordHeader{{Key: codec.HeaderBreakerInstance, Value: []byte(k.instance)}}}
	if open {
		v, err := event.EncodeBreakerItem(&event.BreakerItem{Scope: ref.Scope.Name(), Key: ref.Key, TaskID: taskID,
			OpenedAt: event.At(now), Instance: k.instance})
		if err != nil { // only a bug can get here: every field is the router's own
			k.log.Error("latch item does not encode", "task_id", taskID, "scope", ref.Scope, "key", ref.Key, "err", err)
			return
		}
		rec.Value = v
	}
	out.Queue(rec)
}

// latchCounts returns the latch items and RESET records live on the
// breakers topic as this instance has read it.
func (k *Breakers) latchCounts() (items, resets int) {
	k.table.mu.Lock()
	defer k.table.mu.Unlock()
	return k.table.book.Len()
}

// tableFresh reports whether the batch's view of the breakers topic may end
// a latch: the table had read to a listing of the topic taken at most
// FreshFor before the batch adopted what it read (fresh), and to where the
// latest assignment began. Every item another instance committed before
// then is in it, so no template reopens while an item the table has not
// read yet holds it. Latching needs no such wait: it only holds more.
func (k *Breakers) tableFresh() bool { return k.table.current() && k.freshAge() <= FreshFor }

// freshAge is how old the table was when the batch adopted what it read:
// the time since the listing it had read to was taken (none without a
// topic: its latches are its own).
func (k *Breakers) freshAge() time.Duration {
	if k.table.topic == "" {
		return 0
	}
	return time.Since(k.fresh)
}

// Publishing reports whether the batch may publish retries: not while the
// assignment waits for the breakers topic to be read to where it stood
// when the assignment began (CatchUpTable), nor while the table is not
// fresh (FreshFor: its reader, or this process, was held back). Its due
// retries, expiries and alerts wait in the store's time indexes meanwhile,
// and the wait shows in faultrouter_breakers_catching_up, in readiness
// (the assignment's wait), and in a log line every TableCatchUp.
// readyChanged is called when the assignment begins or ends its wait
// (readiness follows Current).
func (k *Breakers) Publishing(readyChanged func()) bool {
	cur := k.table.current()
	switch k.catchingUpWait.step(!cur) {
	case waitBegan:
		readyChanged()
	case waitEnded:
		k.log.Info("breakers topic read to where the assignment began: retries are published again",
			"topic", k.table.topic, "waited", k.catchingUpWait.took.Round(time.Millisecond))
		readyChanged()
	case waitGoesOn:
		k.table.mu.Lock()
		target, read := maps.Clone(k.table.target), maps.Clone(k.table.read)
		k.table.mu.Unlock()
		k.log.Warn("breakers topic not read to where the assignment began: no retry is published until it is",
			"topic", k.table.topic, "waiting", k.catchingUpWait.took.Round(time.Second), "target", target, "read", read)
	}
	age := k.freshAge()
	fresh := age <= FreshFor
	switch k.staleWait.step(!fresh) {
	case waitBegan:
		k.log.Info("breakers table not read to a listing of the topic taken in the last "+FreshFor.String()+"; due retries wait until it is",
			"topic", k.table.topic, "age", age.Round(time.Millisecond))
	case waitEnded:
		k.log.Info("breakers table fresh again: retries are published again",
			"topic", k.table.topic, "waited", k.staleWait.took.Round(time.Millisecond))
	case waitGoesOn:
		k.log.Warn("breakers table still not fresh: no retry is published until it is", "topic", k.table.topic,
			"waiting", k.staleWait.took.Round(time.Second), "age", age.Round(time.Second))
	}
	if !cur || !fresh {
		k.catchingUp.Set(1)
	} else {
		k.catchingUp.Set(0)
	}
	return cur && fresh
}

// wait is a stretch of batches that publish no retry for one reason: since
// when, and when it was last logged.
type wait struct {
	since, logged time.Time
	took          time.Duration // how long it has lasted, or lasted (step)
}

// What a batch's step changed of a wait.
const (
	waitSame   = iota // nothing to say
	waitBegan         // this batch began it
	waitEnded         // the wait ended before this batch
	waitGoesOn        // it has gone on for another TableCatchUp since it was last logged
)

// step takes in whether this batch waits and says what changed.
func (w *wait) step(waiting bool) int {
	now := time.Now()
	switch {
	case waiting && w.since.IsZero():
		w.since, w.logged, w.took = now, now, 0
		return waitBegan
	case !waiting && !w.since.IsZero():
		w.took = now.Sub(w.since)
		w.since, w.logged = time.Time{}, time.Time{}
		return waitEnded
	case waiting && now.Sub(w.logged) >= TableCatchUp:
		w.logged, w.took = now, now.Sub(w.since)
		return waitGoesOn
	}
	return waitSame
}
