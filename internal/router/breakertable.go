package router

// breakertable.go shares the breakers between router instances and across
// restarts, the way Kafka Streams reads a global table: every change of a
// breaker's state this instance makes itself (open, half-open, close, latch,
// reset) is written, in the transaction of the batch that made it, to the
// compacted breakers topic, keyed "<scope>/<key>", as an
// event.BreakerState. A goroutine reads the topic (read_committed) from its
// start: the router joins its group only once it has read to the end, and
// then follows it. The states it reads wait in pending, the latest per
// breaker, until the run loop applies them at the start of its next batch
// (adoptShared), since a breaker.Set is not safe for concurrent use; the
// adopted transitions are written to the alerts topic in that batch like any
// other. Its own records, once the initial read is done, are skipped: the
// instance made those changes itself. The topic also holds the latch items
// (latchitems.go), keyed "item/...": they are read and applied the same way.
//
// Last writer wins, with three rules that keep a latch until a person resets
// it: a latched OPEN is adopted unless a reset newer than it was applied; a
// reset closes a latched breaker unless it is older than the latch; any
// other state is ignored by a latched breaker, and by one whose last change
// here is newer than it. So that the rules see every latch and reset, the
// states waiting to be applied are not one per breaker: a breaker keeps its
// latest latch, its latest reset and its latest other state apart, and they
// are applied in the order they were written (the order of the topic's
// partition, which one breaker's records share; their times may be equal).
// (Kept as one, a latch another instance wrote would be lost here when an
// instance that had not seen it yet wrote a state of its own after it, or
// when this instance did.)

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/scan"
	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// breakerTable is the reader of the breakers topic.
type breakerTable struct {
	topic string
	self  string // this instance's ID: its own records are skipped once loaded
	log   *slog.Logger

	mu      sync.Mutex
	pending map[breaker.Ref]*pendingStates
	seq     uint64 // counts the states read, in the order read
	// items are the latch items (latchitems.go) not applied yet, by record
	// key, the latest of each: nil for one decided
	items  map[string]*latchItem
	done   bool          // the initial read reached the end (under mu)
	loaded chan struct{} // closed then
	// read is, per partition, the offset after the last record the
	// table has read (control records included), under mu; catchUp
	// waits on it
	read map[int32]int64
	// stopped is closed when the reader has stopped (the router stops)
	stopped chan struct{}
}

func newBreakerTable(topic, self string, log *slog.Logger) *breakerTable {
	return &breakerTable{topic: topic, self: self, log: log, pending: map[breaker.Ref]*pendingStates{},
		items: map[string]*latchItem{}, loaded: make(chan struct{}), read: map[int32]int64{},
		stopped: make(chan struct{})}
}

// run reads the topic until ctx ends, starting again from the beginning
// after an error (the rules of adoption make a state read twice harmless).
func (t *breakerTable) run(ctx context.Context, clientOpts []kgo.Opt) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := t.follow(ctx, clientOpts)
		if ctx.Err() != nil {
			return
		}
		t.log.Warn("reading the breakers topic failed; reading it again", "topic", t.topic, "err", err, "backoff", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// follow reads the topic from its start: to the last stable offsets it had
// when it started (then the table is loaded), and on while ctx lasts.
func (t *breakerTable) follow(ctx context.Context, clientOpts []kgo.Opt) error {
	cl, err := kgo.NewClient(append(append([]kgo.Opt{}, clientOpts...),
		kgo.ConsumeTopics(t.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(), // a transaction's marker may be the last offset before the end
	)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	ranges, err := scan.Committed(ctx, kadm.NewClient(cl), t.topic)
	if err != nil {
		return err
	}
	for {
		t.mu.Lock()
		if !t.done && !t.behind(ranges) {
			t.done = true
			close(t.loaded)
		}
		t.mu.Unlock()
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if beforeTableFetch != nil {
			beforeTableFetch()
		}
		var ferr error
		fetches.EachError(func(_ string, _ int32, err error) { ferr = err })
		if ferr != nil {
			return ferr
		}
		fetches.EachRecord(func(rec *kgo.Record) {
			defer t.readTo(rec.Partition, rec.Offset+1) // after the record is in pending
			if rec.Attrs.IsControl() {
				return
			}
			if strings.HasPrefix(string(rec.Key), event.BreakerItemPrefix) {
				t.putItem(rec)
				return
			}
			if rec.Value == nil {
				return
			}
			s, err := event.DecodeBreakerState(rec.Value)
			if err != nil {
				t.log.Warn("breakers topic: a record that is not a breaker state is skipped", "partition", rec.Partition, "offset", rec.Offset, "err", err)
				return
			}
			t.put(s)
		})
	}
}

// beforeTableFetch, in tests, runs before the table handles each fetch: a
// test holds the table back with it. Nil in production.
var beforeTableFetch func()

// readTo records that the table has read partition p up to next.
func (t *breakerTable) readTo(p int32, next int64) {
	t.mu.Lock()
	t.read[p] = max(t.read[p], next)
	t.mu.Unlock()
}

// behind reports whether the table has not read some partition of the
// topic up to its end in ranges; under mu.
func (t *breakerTable) behind(ranges scan.Ranges) bool {
	for p, r := range ranges[t.topic] {
		if r.End > r.Start && t.read[p] < r.End {
			return true
		}
	}
	return false
}

// catchUp waits until the table has read every record committed to the
// topic before it was called: to the last stable offsets adm lists now. It
// does not wait for a transaction open then: that may be another
// instance's, itself waiting for its own assignment to end (a transaction's
// end waits on the group's heartbeat). It gives up after wait (or when ctx
// ends, or the reader stops) and reports whether it caught up.
func (t *breakerTable) catchUp(ctx context.Context, adm *kadm.Client, wait time.Duration) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	ranges, err := scan.Committed(ctx, adm, t.topic)
	if err != nil {
		return false, err
	}
	for {
		t.mu.Lock()
		behind := t.behind(ranges)
		t.mu.Unlock()
		if !behind {
			return true, nil
		}
		select {
		case <-ctx.Done():
			return false, nil
		case <-t.stopped:
			return false, errTableStopped
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// errTableStopped is catchUp's error once the reader has stopped.
var errTableStopped = errors.New("the breakers topic's reader has stopped")

// put keeps s as the latest state of its breaker not yet applied.
func (t *breakerTable) put(s event.BreakerState) {
	sc, err := breaker.ParseScope(s.Scope)
	if err != nil {
		t.log.Warn("breakers topic: a breaker state of an unknown scope is skipped", "scope", s.Scope, "key", s.Key)
		return
	}
	ref := breaker.Ref{Scope: sc, Key: s.Key}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done && s.Instance == t.self {
		return // this instance's own change: it made it itself
	}
	t.seq++
	t.keep(pendingState{s, ref, t.seq})
}

// pendingState is a state read and not applied yet, with its breaker and
// its place in the order read.
type pendingState struct {
	event.BreakerState
	ref breaker.Ref
	seq uint64
}

// pendingStates are the states of one breaker not applied yet: the latest
// latch, the latest reset and the latest of any other state.
type pendingStates struct {
	latch, reset, other *pendingState
}

// keep keeps s among the pending states of its breaker, unless one of its
// kind read later is there (under mu).
func (t *breakerTable) keep(s pendingState) {
	p := t.pending[s.ref]
	if p == nil {
		p = &pendingStates{}
		t.pending[s.ref] = p
	}
	slot := &p.other
	switch {
	case s.Latched:
		slot = &p.latch
	case s.Reset:
		slot = &p.reset
	}
	if *slot == nil || (*slot).seq < s.seq {
		*slot = &s
	}
}

// putItem keeps an item record (a tombstone for one decided) as the latest
// of its key not yet applied. Its own, once loaded, are skipped like its own
// states.
func (t *breakerTable) putItem(rec *kgo.Record) {
	key := string(rec.Key)
	var it *latchItem
	writer := ""
	if rec.Value != nil {
		x, err := event.DecodeBreakerItem(rec.Value)
		sc, serr := breaker.ParseScope(x.Scope)
		if err == nil {
			err = serr
		}
		if err != nil {
			t.log.Warn("breakers topic: a record that is not a latch item is skipped", "partition", rec.Partition, "offset", rec.Offset, "err", err)
			return
		}
		it = &latchItem{ref: breaker.Ref{Scope: sc, Key: x.Key}, task: x.TaskID, openedAt: x.OpenedAt.UnixMilli()}
		writer = x.Instance
	}
	if h := codec.ParseBreakerHeaders(rec.Headers); h.Instance != "" {
		writer = h.Instance
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done && writer == t.self {
		delete(t.items, key)
		return
	}
	t.items[key] = it
}

// takeItems returns the items not applied yet and forgets them.
func (t *breakerTable) takeItems() map[string]*latchItem {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.items) == 0 {
		return nil
	}
	p := t.items
	t.items = map[string]*latchItem{}
	return p
}

// take returns the states not applied yet, in the order they were read,
// and forgets them.
func (t *breakerTable) take() []pendingState {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.pending) == 0 {
		return nil
	}
	var out []pendingState
	for _, p := range t.pending {
		for _, s := range [...]*pendingState{p.latch, p.reset, p.other} {
			if s != nil {
				out = append(out, *s)
			}
		}
	}
	clear(t.pending)
	slices.SortFunc(out, func(x, y pendingState) int { return cmp.Compare(x.seq, y.seq) })
	return out
}

// giveBack returns the states of a batch that did not commit, each unless
// one of its breaker and kind read later arrived meanwhile.
func (t *breakerTable) giveBack(p []pendingState) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, s := range p {
		t.keep(s)
	}
}

// startTable starts reading the breakers topic and waits until it is read
// to its end, so that the router joins its group (and reports ready) only
// with every instance's breakers in hand. Without a breakers topic
// (Topics.Breakers empty) breakers are this instance's own.
func (k *breakers) startTable(ctx context.Context, clientOpts []kgo.Opt) error {
	if k.topics.Breakers == "" {
		return nil
	}
	t := newBreakerTable(k.topics.Breakers, k.instance, k.log)
	k.table = t
	go func() {
		defer close(t.stopped)
		t.run(ctx, clientOpts)
	}()
	select {
	case <-t.loaded:
		k.log.Info("breakers topic read to its end", "topic", t.topic)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// tableCatchUp bounds how long an assignment waits for the breakers table
// to read what is committed (catchUpTable): a reader that cannot reach the
// broker should not hold the assignment for longer.
const tableCatchUp = 10 * time.Second

// catchUpTable waits, when an assignment begins (onAssigned), until the
// table has read every breaker state and latch item committed to the topic
// before: the first batch of the assignment then adopts them (adoptShared)
// before it decides. An instance that was paused, or whose table could not
// read past a paused instance's open transaction (aborted by the time that
// instance rejoins), would otherwise publish the due retries of its new
// assignment on the breakers it knew before: a template another instance
// latched meanwhile among them.
func (k *breakers) catchUpTable(ctx context.Context, cl *kgo.Client) {
	if k == nil || k.table == nil {
		return
	}
	began := time.Now()
	ok, err := k.table.catchUp(ctx, kadm.NewClient(cl), tableCatchUp)
	switch {
	case errors.Is(err, errTableStopped):
		// the router is stopping: the assignment will not route
	case err != nil:
		k.log.Warn("breakers topic: could not list its last stable offsets; the assignment begins with the breaker states read so far", "topic", k.table.topic, "err", err)
	case !ok:
		k.log.Warn("breakers topic: not read to its end in time; the assignment begins with the breaker states read so far", "topic", k.table.topic, "waited", tableCatchUp)
	default:
		k.log.Info("breakers topic read to its end for the assignment", "topic", k.table.topic, "took", time.Since(began).Round(time.Millisecond))
	}
}

// adoptShared applies, at the start of a batch (after begin), the
// breaker states other instances wrote since the last batch, and queues the
// transitions they cause on the alerts topic, with the reason "adopted from
// <instance>: <its reason>". A batch that does not commit gives them back
// (rollback) with its other breaker changes.
func (k *breakers) adoptShared(out recordsOut, now time.Time) {
	if k.table == nil {
		return
	}
	for key, it := range k.table.takeItems() {
		k.items.adopt(key, it)
	}
	p := k.table.take()
	k.adopting = p
	for i := range p {
		k.adopt(p[i].ref, &p[i].BreakerState, out, now)
	}
	k.gauges()
}

// adopt applies one breaker state another instance wrote (the rules are in
// the file's comment).
func (k *breakers) adopt(ref breaker.Ref, s *event.BreakerState, out recordsOut, now time.Time) {
	at := s.UpdatedAt.UnixMilli()
	cur := k.set.Shared(ref)
	latchedHere := cur.State == breaker.Open && cur.Latched
	switch {
	case s.Latched:
		if at < k.lastReset[ref] {
			return
		}
	case s.Reset:
		if latchedHere && at < cur.OpenedAt.UnixMilli() {
			return
		}
		k.lastReset[ref] = max(k.lastReset[ref], at)
	case latchedHere, at < k.lastChange[ref]:
		return
	}
	sh := breaker.Shared{Latched: s.Latched, Elsewhere: s.Instance != k.instance}
	sh.State, _ = breaker.ParseState(s.State)
	if s.OpenedAt != nil {
		sh.OpenedAt = s.OpenedAt.Time
	}
	who := s.Instance
	if who == "" {
		who = "another instance"
	}
	ts := k.set.Adopt(ref, sh, "adopted from "+who+": "+s.Reason, now)
	k.lastChange[ref] = max(k.lastChange[ref], at)
	k.transitionEventsFrom(ts, out, who)
}

// share queues the shared state of ref, as this instance's change, on the
// breakers topic in the batch's transaction; reset marks a person's reset.
func (k *breakers) share(ref breaker.Ref, reason string, reset bool, out recordsOut, now time.Time) {
	if k.topics.Breakers == "" {
		return
	}
	sh := k.set.Shared(ref)
	s := event.BreakerState{Scope: ref.Scope.String(), Key: ref.Key, State: sh.State.String(), Latched: sh.Latched,
		Reset: reset && sh.State == breaker.Closed, Reason: reason, UpdatedAt: event.At(now), Instance: k.instance}
	if sh.State == breaker.Open {
		at := event.At(sh.OpenedAt)
		s.OpenedAt = &at
	}
	v, err := event.EncodeBreakerState(&s)
	if err != nil { // only a bug can get here: every field is the router's own
		k.log.Error("breaker state does not encode", "scope", s.Scope, "key", s.Key, "err", err)
		return
	}
	k.lastChange[ref] = max(k.lastChange[ref], now.UnixMilli())
	if reset {
		k.lastReset[ref] = max(k.lastReset[ref], now.UnixMilli())
	}
	out.queue(&kgo.Record{Topic: k.topics.Breakers, Key: []byte(event.BreakerStateKey(s.Scope, s.Key)), Value: v, Timestamp: now})
}

// shareItem queues, on the breakers topic in the batch's transaction, an
// open latch item of ref for the task (open), or the tombstone of its item
// once decided, and records it in this instance's items.
func (k *breakers) shareItem(ref breaker.Ref, taskID string, open bool, out recordsOut, now time.Time) {
	key := event.BreakerItemKey(ref.Scope.String(), ref.Key, taskID)
	if !open {
		k.items.del(key)
	} else {
		k.items.put(key, latchItem{ref: ref, task: taskID, openedAt: now.UnixMilli()})
	}
	if k.topics.Breakers == "" {
		return
	}
	rec := &kgo.Record{Topic: k.topics.Breakers, Key: []byte(key), Timestamp: now,
		Headers: []kgo.RecordHeader{{Key: codec.HeaderBreakerInstance, Value: []byte(k.instance)}}}
	if open {
		v, err := event.EncodeBreakerItem(&event.BreakerItem{Scope: ref.Scope.String(), Key: ref.Key, TaskID: taskID,
			OpenedAt: event.At(now), Instance: k.instance})
		if err != nil { // only a bug can get here: every field is the router's own
			k.log.Error("latch item does not encode", "task_id", taskID, "scope", ref.Scope, "key", ref.Key, "err", err)
			return
		}
		rec.Value = v
	}
	out.queue(rec)
}

// pruneChanges forgets the times of changes older than an hour once there
// are more of them than breakers a set may hold: keys come from events.
func (k *breakers) pruneChanges(now time.Time) {
	if len(k.lastChange)+len(k.lastReset) <= breaker.MaxBreakers {
		return
	}
	old := now.Add(-time.Hour).UnixMilli()
	maps.DeleteFunc(k.lastChange, func(_ breaker.Ref, at int64) bool { return at < old })
	maps.DeleteFunc(k.lastReset, func(_ breaker.Ref, at int64) bool { return at < old })
}
