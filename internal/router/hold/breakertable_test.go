package hold

import (
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/task"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// adoptBreakers are breakers with what a router gives them: the default
// policy's, the codec, instance "b", a breakers topic that the test feeds
// (feed, readBack) instead of a reader, and partition 0 of ingress, which
// this instance owns and every key hashes to.
func adoptBreakers(t *testing.T) *Breakers {
	t.Helper()
	k, err := New(policy.Default(), nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := codec.New()
	if err != nil {
		t.Fatal(err)
	}
	k.Attach(Deps{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Codec: c, Instance: "b",
		Topics: topicspec.Topics{Alerts: "alerts", Breakers: "breakers"}, Owner: testOwner{0: true},
		Home: func([]byte) int32 { return 0 }})
	k.table.done = true // read to its end: the test feeds it
	k.table.target = map[int32]int64{}
	k.table.legacyParts = true                  // as an upgraded topic has: feedLegacy
	k.table.freshAt = time.Now().Add(time.Hour) // and fresh, unless a test says otherwise
	return k
}

// testBatch is a batch's output and task states, as the router's batch
// holds them.
type testBatch struct {
	out    []*kgo.Record
	states map[string]*task.State
}

func newTestBatch() *testBatch { return &testBatch{states: map[string]*task.State{}} }

func (b *testBatch) Queue(rec *kgo.Record) { b.out = append(b.out, rec) }

// testOwner is the partitions this instance owns, assigned long ago.
type testOwner map[int32]bool

func (o testOwner) OwnedSet() map[int32]bool { return o }

func (o testOwner) AssignedSince(uint64) (map[int32]bool, uint64, bool) { return o, 0, false }

// tplRef is the prompt template the tests latch.
var tplRef = breaker.Ref{Scope: breaker.PromptTemplate, Key: "tpl"}

// feed hands records to r's breakers table as its reader would, at the
// topic's next offsets.
func feed(k *Breakers, recs ...*kgo.Record) {
	t := k.table
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, rec := range recs {
		rec.Offset = t.read[0]
		t.read[0]++
		t.apply(rec)
	}
}

// feedLegacy hands rec to k's breakers table as read from partition p at
// offset off: an earlier release's record, written by key to a partition
// other than 0.
func feedLegacy(k *Breakers, rec *kgo.Record, p int32, off int64) {
	rec.Partition, rec.Offset = p, off
	k.table.mu.Lock()
	defer k.table.mu.Unlock()
	k.table.apply(rec)
}

// readBack feeds the breakers records of b (this instance's batch, committed).
func readBack(k *Breakers, b *testBatch) {
	for _, rec := range b.out {
		if rec.Topic == "breakers" {
			c := *rec
			feed(k, &c)
		}
	}
}

// itemRec is another instance's latch item of tpl for task (a tombstone when
// !open).
func itemRec(t *testing.T, task, writer string, open bool) *kgo.Record {
	t.Helper()
	rec := &kgo.Record{Key: []byte(event.BreakerItemKey(tplRef.Scope.Name(), tplRef.Key, task)),
		Headers: []kgo.RecordHeader{{Key: codec.HeaderBreakerInstance, Value: []byte(writer)}}}
	if open {
		v, err := event.EncodeBreakerItem(&event.BreakerItem{Scope: tplRef.Scope.Name(), Key: tplRef.Key, TaskID: task,
			OpenedAt: event.At(time.Now()), Instance: writer})
		if err != nil {
			t.Fatal(err)
		}
		rec.Value = v
	}
	return rec
}

// resetRec is a person's RESET of ref, as `faultrouter breaker reset` writes it.
func resetRec(t *testing.T, ref breaker.Ref, who string) *kgo.Record {
	t.Helper()
	v, err := event.EncodeBreakerState(&event.BreakerState{Scope: ref.Scope.Name(), Key: ref.Key, State: breaker.Closed.Name(),
		Reset: true, Reason: "prompt fixed", UpdatedAt: event.At(time.Now()), Instance: who})
	if err != nil {
		t.Fatal(err)
	}
	return &kgo.Record{Key: []byte(event.BreakerResetKey(ref.Scope.Name(), ref.Key)), Value: v,
		Headers: []kgo.RecordHeader{{Key: codec.HeaderBreakerInstance, Value: []byte(who)}}}
}

// stateRec is a failure-rate state of ref written by writer (a tombstone
// for CLOSED); latched marks it as an earlier release wrote latches.
func stateRec(t *testing.T, ref breaker.Ref, state event.BreakerStateName, writer string, latched bool, at time.Time) *kgo.Record {
	t.Helper()
	rec := &kgo.Record{Key: []byte(event.BreakerStateKey(ref.Scope.Name(), ref.Key)),
		Headers: []kgo.RecordHeader{{Key: codec.HeaderBreakerInstance, Value: []byte(writer)}}}
	if state == breaker.Closed.Name() {
		return rec
	}
	s := event.BreakerState{Scope: ref.Scope.Name(), Key: ref.Key, State: state, Latched: latched, Reason: "why",
		UpdatedAt: event.At(at), Instance: writer}
	if state == breaker.Open.Name() {
		o := event.At(at)
		s.OpenedAt = &o
	}
	v, err := event.EncodeBreakerState(&s)
	if err != nil {
		t.Fatal(err)
	}
	rec.Value = v
	return rec
}

// step runs one batch of r's breakers at now: adoption, then fn, committed
// or not; it returns the batch.
func step(k *Breakers, now time.Time, commit bool, fn func(b *testBatch)) *testBatch {
	b := newTestBatch()
	k.Begin(now)
	k.AdoptShared(b, now)
	if fn != nil {
		fn(b)
	}
	if commit {
		k.Commit()
	} else {
		k.Rollback()
	}
	return b
}

// hallucinate routes a MODEL_HALLUCINATION of template tpl for the task
// through observe, in its own committed batch, and returns the batch.
func hallucinate(t *testing.T, k *Breakers, id, tpl string, now time.Time) *testBatch {
	t.Helper()
	return step(k, now, true, func(b *testBatch) {
		ev := event.TaskEvent{TaskID: id, PromptTemplate: tpl, Provider: "p", Model: "m", Action: "refund", Stage: event.StageModel}
		d := event.Decision{Class: event.ClassHallucination, Route: event.RouteQuarantine, Reason: "fabricated_data"}
		k.Observe(&ev, &d, nil, b, now)
	})
}

// decideItem routes a reviewer's decision of the task's hallucination item
// through observe, in its own batch, committed or not.
func decideItem(t *testing.T, k *Breakers, id, tpl string, now time.Time, commit bool) *testBatch {
	t.Helper()
	return step(k, now, commit, func(b *testBatch) {
		b.states[id] = &task.State{TaskID: id, LastEvent: &event.TaskEvent{TaskID: id, PromptTemplate: tpl}}
		rv := event.ReviewDecision{TaskID: id, Reason: "checked", Reviewer: "ana"}
		d := event.Decision{Class: event.ClassHallucination, Route: event.RouteComplete}
		k.Reviewed(&rv, &d, b.states[id], b, now)
	})
}

// itemRecords counts the latch item records (open) and tombstones of a batch.
func itemRecords(b *testBatch) (open, decided int) {
	for _, rec := range b.out {
		if rec.Topic != "breakers" || !strings.HasPrefix(string(rec.Key), event.BreakerItemPrefix) {
			continue
		}
		if rec.Value == nil {
			decided++
		} else {
			open++
		}
	}
	return open, decided
}

// Guards the latch rule of hallucinations: every hallucination writes its
// item, latched already or not; a template latched by two stays latched (no
// transition, nothing on decisions) when the first item is decided, whatever
// the decision, whether or not the item records were read back yet; it
// reopens when the second is decided. A decision whose batch does not
// commit changes nothing.
func TestTemplateStaysLatchedUntilEveryItemIsDecided(t *testing.T) {
	k := adoptBreakers(t)
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)

	if b := hallucinate(t, k, "h-1", "tpl", t0); !k.set.Latched(tplRef) {
		t.Fatal("a hallucination did not latch its template")
	} else if open, _ := itemRecords(b); open != 1 {
		t.Fatalf("the first hallucination wrote %d latch item records, want 1", open)
	}
	b2 := hallucinate(t, k, "h-2", "tpl", t0.Add(time.Second))
	if len(k.events) != 1 {
		t.Fatalf("the second hallucination queued %+v, want only its alert (the template is latched already)", k.events)
	} else if open, _ := itemRecords(b2); open != 1 {
		t.Fatalf("the second hallucination wrote %d latch item records, want 1", open)
	}

	// a decision whose transaction does not commit is undone
	decideItem(t, k, "h-1", "tpl", t0.Add(2*time.Second), false)
	if got := k.holdingItems(tplRef); len(got) != 2 {
		t.Fatalf("after a decision that did not commit, open items %v, want h-1 and h-2", got)
	}

	b := decideItem(t, k, "h-1", "tpl", t0.Add(3*time.Second), true)
	if !k.set.Latched(tplRef) {
		t.Fatal("deciding the first of two items reopened the template")
	}
	if len(k.events) != 0 {
		t.Fatalf("deciding the first of two items queued %+v, want no transition", k.events)
	}
	if _, decided := itemRecords(b); decided != 1 {
		t.Fatalf("deciding an item wrote %d tombstones, want 1", decided)
	}
	for _, rec := range b.out {
		if rec.Topic != "breakers" {
			t.Fatalf("deciding the first of two items wrote to %s: %s", rec.Topic, rec.Key)
		}
	}
	readBack(k, b2)
	readBack(k, b)
	step(k, t0.Add(3500*time.Millisecond), true, nil)
	if !k.set.Latched(tplRef) {
		t.Fatal("reading back this instance's own items reopened the template while h-2 is open")
	}

	decideItem(t, k, "h-2", "tpl", t0.Add(4*time.Second), true)
	if k.set.State(tplRef) != breaker.Closed {
		t.Fatalf("deciding the last item left the template %s, want CLOSED", k.set.State(tplRef))
	}
	if len(k.events) != 1 || k.events[0].To != breaker.Closed.Name() || k.events[0].TaskID != "h-2" {
		t.Fatalf("deciding the last item queued %+v, want one CLOSED transition naming h-2", k.events)
	}
}

// Guards that the latch items of every instance hold, and that a RESET
// ends those written before it: another instance's item, read from the
// breakers topic, latches the template here and keeps it latched when this
// instance decides its own; a RESET record read after both releases it, and
// this instance writes the tombstone of the item it ended (its task is
// this instance's); a later hallucination latches again and is held only by
// its own item.
func TestOtherInstancesItemsHoldAndAResetEndsThoseBeforeIt(t *testing.T) {
	k := adoptBreakers(t)
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)

	feed(k, itemRec(t, "h-9", "a", true))
	step(k, t0, true, nil)
	if !k.set.Latched(tplRef) {
		t.Fatal("another instance's item did not latch the template here")
	}
	readBack(k, hallucinate(t, k, "h-1", "tpl", t0))
	readBack(k, decideItem(t, k, "h-1", "tpl", t0.Add(time.Second), true))
	if !k.set.Latched(tplRef) {
		t.Fatal("deciding this instance's item reopened the template while another instance's item h-9 is open")
	}

	feed(k, resetRec(t, tplRef, "ops"))
	b := step(k, t0.Add(2*time.Second), true, nil)
	if k.set.State(tplRef) != breaker.Closed || !k.closed[tplRef] {
		t.Fatalf("a RESET read after every item left the template %s (closed for release: %v), want CLOSED", k.set.State(tplRef), k.closed[tplRef])
	}
	if _, decided := itemRecords(b); decided != 1 {
		t.Fatalf("the reset's batch wrote %d item tombstones, want 1 (h-9, ended by the reset)", decided)
	}
	readBack(k, b)
	b = step(k, t0.Add(2500*time.Millisecond), true, nil)
	if n := len(b.out); n != 1 || !strings.HasPrefix(string(b.out[0].Key), event.BreakerResetPrefix) || b.out[0].Value != nil {
		t.Fatalf("once no item before the RESET is open, the batch wrote %v, want the RESET's tombstone", b.out)
	}
	readBack(k, b)
	if items, resets := k.latchCounts(); items != 0 || resets != 0 {
		t.Fatalf("%d items and %d RESETs live after the reset was tidied, want none", items, resets)
	}

	readBack(k, hallucinate(t, k, "h-3", "tpl", t0.Add(3*time.Second)))
	if !k.set.Latched(tplRef) {
		t.Fatal("a hallucination after the reset did not latch the template")
	}
	decideItem(t, k, "h-3", "tpl", t0.Add(4*time.Second), true)
	if k.set.State(tplRef) != breaker.Closed {
		t.Fatal("an item the reset ended kept a later latch")
	}
}

// Guards a RESET applied late: an instance that reads a RESET only after a
// newer hallucination's item (a higher offset) keeps the template latched,
// whatever order its batches see them in, and shares no reset of its own;
// the RESET command on the decisions topic, read late, changes nothing.
// And a hallucination routed here while the template is latched here writes
// its item: read back after the RESET, it holds the template.
func TestALateResetKeepsTheNewerLatch(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)
	t.Run("another instance's newer item", func(t *testing.T) {
		k := adoptBreakers(t)
		feed(k, itemRec(t, "h-1", "a", true))
		step(k, t0, true, nil)
		// the reset and a's newer hallucination, read in one go
		feed(k, resetRec(t, tplRef, "ops"), itemRec(t, "h-2", "a", true))
		b := step(k, t0.Add(time.Minute), true, func(b *testBatch) {
			cmd := event.BreakerEvent{Scope: tplRef.Scope.Name(), Key: tplRef.Key, Kind: event.BreakerKindReset,
				Reason: "prompt fixed", Instance: "ops", At: event.At(t0)}
			if d := k.Command(&cmd, b, t0.Add(time.Minute)); d.Rule != "breaker.reset" {
				t.Errorf("the RESET command's decision %+v, want rule breaker.reset", d)
			}
		})
		if !k.set.Latched(tplRef) {
			t.Fatal("a RESET read with a newer item released the template")
		}
		for _, rec := range b.out {
			if rec.Topic == "breakers" && !strings.HasPrefix(string(rec.Key), event.BreakerItemPrefix) {
				t.Fatalf("the batch shared %s on the breakers topic, want no state of a latched template", rec.Key)
			}
		}
		feed(k, itemRec(t, "h-2", "a", false))
		step(k, t0.Add(2*time.Minute), true, nil)
		if k.set.State(tplRef) != breaker.Closed {
			t.Fatal("the template stayed latched after the newer item was decided")
		}
	})
	t.Run("this instance's hallucination before it read the reset", func(t *testing.T) {
		k := adoptBreakers(t)
		feed(k, itemRec(t, "h-1", "a", true))
		step(k, t0, true, nil)
		feed(k, resetRec(t, tplRef, "ops")) // written, not handed to a batch yet
		b := hallucinate(t, k, "h-3", "tpl", t0.Add(time.Second))
		if open, _ := itemRecords(b); open != 1 {
			t.Fatalf("a hallucination routed while latched wrote %d items, want 1", open)
		}
		step(k, t0.Add(2*time.Second), true, nil) // adopts the reset before h-3 is read back
		if !k.set.Latched(tplRef) {
			t.Fatal("the reset released the template while this instance's newer item was not read back")
		}
		readBack(k, b)
		step(k, t0.Add(3*time.Second), true, nil)
		if !k.set.Latched(tplRef) {
			t.Fatal("this instance's item, written after the reset, does not hold the template")
		}
	})
}

// Guards what compaction leaves of a latch: the breakers topic keeps the
// latest record of every key. Another instance that had not read the latch
// wrote its own states of the template after it (a HALF_OPEN, then its
// CLOSED tombstone); once cleaned, a new instance reads the item and that
// tombstone only, and must hold the template latched.
func TestCompactedTopicKeepsTheLatch(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)
	whole := []*kgo.Record{
		itemRec(t, "h-1", "a", true),
		stateRec(t, tplRef, breaker.Open.Name(), "a", true, t0), // an earlier release's latched state
		stateRec(t, tplRef, breaker.HalfOpen.Name(), "c", false, t0.Add(time.Minute)),
		stateRec(t, tplRef, breaker.Closed.Name(), "c", false, t0.Add(2*time.Minute)),
	}
	for _, tc := range []struct {
		name string
		recs []*kgo.Record
	}{
		{"the whole log", whole},
		{"compacted", []*kgo.Record{whole[0], whole[3]}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := adoptBreakers(t)
			k.table.done = false // the initial read
			feed(k, tc.recs...)
			k.table.done = true
			step(k, t0.Add(time.Hour), true, nil)
			if !k.set.Latched(tplRef) {
				t.Fatalf("reading %s: the template is %s, want latched by h-1's item", tc.name, k.set.State(tplRef))
			}
			if ok, _ := k.set.Allow([]breaker.Ref{tplRef}, t0.Add(48*time.Hour)); ok {
				t.Fatal("a retry into the latched template is allowed 48 hours later")
			}
		})
	}
}

// Guards the order of failure-rate states by offsets, not clocks: a state
// another instance wrote before this instance's own change of the breaker
// (read before that change is read back) is not applied over it, whatever
// its time says; one written after it is, keeping the time it opened on its
// writer, so that the retries held here wait for the writer's cooldown and
// its probes.
func TestStatesAreOrderedByOffsets(t *testing.T) {
	k := adoptBreakers(t)
	ref := breaker.Ref{Scope: breaker.ProviderModel, Key: "acme/m1"}
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)
	var own *testBatch
	step(k, t0, true, func(b *testBatch) {
		k.set.Trip(ref, "x", breaker.Outcome{}, t0)
		k.set.Reset(ref, "x", t0)
		k.share(ref, "own change", b, t0) // CLOSED: a tombstone
		own = b
	})
	if len(own.out) != 1 || own.out[0].Topic != "breakers" || string(own.out[0].Key) != "PROVIDER_MODEL/acme/m1" || own.out[0].Value != nil {
		t.Fatalf("share queued %v, want the tombstone of PROVIDER_MODEL/acme/m1 on the breakers topic", own.out)
	}
	// c's OPEN, stamped an hour later, was written before this instance's
	// change: it is read before it
	feed(k, stateRec(t, ref, breaker.Open.Name(), "c", false, t0.Add(time.Hour)))
	step(k, t0.Add(time.Second), true, nil)
	if k.set.State(ref) != breaker.Closed {
		t.Fatal("an OPEN written before this instance's own change was adopted over it")
	}
	readBack(k, own)
	opened := t0.Add(-time.Hour) // stamped before: written after
	feed(k, stateRec(t, ref, breaker.Open.Name(), "c", false, opened))
	now := t0.Add(2 * time.Second)
	step(k, now, true, nil)
	if k.set.State(ref) != breaker.Open {
		t.Fatal("an OPEN written after this instance's own change was not adopted")
	}
	cooldown := time.Duration(policy.Default().Breakers.ProviderModel.CooldownMs) * time.Millisecond
	step := min(max(cooldown/4, time.Second), 30*time.Second)
	if got := k.set.HoldUntil([]breaker.Ref{ref}, now); got.Before(opened.Add(cooldown)) {
		t.Fatalf("a retry behind the adopted OPEN is held until %s, want no earlier than the writer's cooldown end %s (+%s)", got, opened.Add(cooldown), step)
	}
}

// Guards the reader's bookkeeping: before the initial read is done, this
// instance's own states are kept (a restart restores them); after, they are
// skipped; a batch that did not commit gives its states back unless a newer
// one arrived.
func TestBreakerTablePendingStates(t *testing.T) {
	k := adoptBreakers(t)
	tb := k.table
	ref := breaker.Ref{Scope: breaker.ProviderModel, Key: "acme/m1"}
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)
	tb.done = false
	feed(k, stateRec(t, ref, breaker.Open.Name(), "b", false, t0))
	if p, _ := tb.changes(); len(p) != 1 || p[0].Instance != "b" {
		t.Fatalf("before the initial read is done, the own state was not kept: %v", p)
	}
	tb.done = true
	feed(k, stateRec(t, ref, breaker.Open.Name(), "b", false, t0))
	if p, _ := tb.changes(); len(p) != 0 {
		t.Fatalf("after the initial read, an own state was kept: %v", p)
	}
	feed(k, stateRec(t, ref, breaker.Open.Name(), "a", false, t0.Add(time.Second)))
	given, _ := tb.changes()
	feed(k, stateRec(t, ref, breaker.HalfOpen.Name(), "a", false, t0.Add(2*time.Second)))
	tb.giveBack(given)
	if p, _ := tb.changes(); len(p) != 1 || p[0].State != breaker.HalfOpen.Name() {
		t.Fatalf("giveBack replaced a newer pending state: %v", p)
	}
	tb.giveBack(given)
	if p, _ := tb.changes(); len(p) != 1 || p[0].State != breaker.Open.Name() {
		t.Fatalf("giveBack lost the state of a batch that did not commit: %v", p)
	}
}

// Guards the count of this instance's own states in flight: a batch that
// changed a breaker twice (OPEN to HALF_OPEN to CLOSED) wrote two records
// of it, and the reader may read both back, then another instance's OPEN
// written after them, before the batch's commit is told to the table. That
// OPEN is newer than everything this instance wrote and must be adopted.
func TestOwnStatesReadBackBeforeTheCommitKeepANewerState(t *testing.T) {
	k := adoptBreakers(t)
	tb := k.table
	ref := breaker.Ref{Scope: breaker.ProviderModel, Key: "acme/m1"}
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)
	step(k, t0, true, func(b *testBatch) {
		k.set.Adopt(ref, breaker.Shared{State: breaker.HalfOpen}, "cooldown over", t0)
		k.share(ref, "cooldown over", b, t0)
		k.set.Adopt(ref, breaker.Shared{State: breaker.Closed}, "a success while half-open", t0)
		k.share(ref, "a success while half-open", b, t0)
		// read back before the commit is told, then c's OPEN after them
		if readBack(k, b); len(b.out) != 2 {
			t.Fatalf("the batch wrote %d records of the breaker, want 2", len(b.out))
		}
		feed(k, stateRec(t, ref, breaker.Open.Name(), "c", false, t0.Add(10*time.Millisecond)))
	})
	if p, _ := tb.changes(); len(p) != 1 || p[0].Instance != "c" || p[0].State != breaker.Open.Name() {
		t.Fatalf("c's OPEN, read after both of this instance's records, was dropped when the batch's commit was told: %v", p)
	}
	// and the other way round: told first, the own records in flight are
	// newer than an OPEN read before them
	tb.wrote(nil, map[breaker.Ref]int{ref: 2}, nil)
	feed(k, stateRec(t, ref, breaker.Open.Name(), "c", false, t0.Add(20*time.Millisecond)))
	if p, _ := tb.changes(); len(p) != 0 {
		t.Fatalf("an OPEN read before this instance's own records in flight was kept: %v", p)
	}
	feed(k, stateRec(t, ref, breaker.HalfOpen.Name(), "b", false, t0.Add(30*time.Millisecond)))
	feed(k, stateRec(t, ref, breaker.Closed.Name(), "b", false, t0.Add(30*time.Millisecond)))
	feed(k, stateRec(t, ref, breaker.Open.Name(), "c", false, t0.Add(40*time.Millisecond)))
	if p, _ := tb.changes(); len(p) != 1 || p[0].Instance != "c" {
		t.Fatalf("c's OPEN read after this instance's records were read back was not kept: %v", p)
	}
}

// Guards that an item a re-drive cleared no longer holds its template: an
// operator re-drives the task of one of two hallucinations (its review item
// is gone, so no one can decide it); its item is tombstoned without
// reopening the template, and the decision of the other item reopens it.
func TestRedriveReleasesTheTasksLatchItem(t *testing.T) {
	k := adoptBreakers(t)
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)
	hallucinate(t, k, "h-1", "tpl", t0)
	hallucinate(t, k, "h-2", "tpl", t0.Add(time.Second))

	b := step(k, t0.Add(2*time.Second), true, func(b *testBatch) {
		ev := event.TaskEvent{TaskID: "h-1", PromptTemplate: "tpl", Provider: "p", Model: "m", Action: "refund", Stage: event.StageModel}
		b.states["h-1"] = &task.State{TaskID: "h-1", LastEvent: &ev} // reopened: no review item
		d := event.Decision{Class: event.ClassSucceeded, Route: event.RouteComplete}
		k.Observe(&ev, &d, b.states["h-1"], b, t0.Add(2*time.Second))
	})
	if _, decided := itemRecords(b); decided != 1 {
		t.Fatalf("the re-driven task's event wrote %d tombstones, want 1", decided)
	}
	if !k.set.Latched(tplRef) {
		t.Fatal("releasing a re-driven task's item reopened the template")
	}
	decideItem(t, k, "h-2", "tpl", t0.Add(3*time.Second), true)
	if k.set.State(tplRef) != breaker.Closed {
		t.Fatal("the decision of the last item held did not reopen the template")
	}
}

// Guards the bound on breaker state: breakers of keys that come and go
// (templates, models) are let go once unused for breaker.Set.Idle, an OPEN
// one with its CLOSED shared as a tombstone of its key, so the set and the
// breakers topic's live keys stay flat; a latched breaker, and one a retry
// is held behind, are kept however long they are unused.
func TestUnusedBreakersAreLetGo(t *testing.T) {
	k := adoptBreakers(t)
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)
	readBack(k, hallucinate(t, k, "h-1", "tpl", t0))
	var refs []breaker.Ref
	before := k.set.Len()
	step(k, t0, true, func(b *testBatch) {
		for i := range 50 {
			ref := breaker.Ref{Scope: breaker.ProviderModel, Key: "gone/model-" + string(rune('a'+i%26)) + strings.Repeat("x", i/26)}
			refs = append(refs, ref)
			k.transitions(k.set.Trip(ref, "x", breaker.Outcome{}, t0), b, t0)
			k.set.Reset(ref, "x", t0)
			k.set.Adopt(ref, breaker.Shared{State: breaker.Open, OpenedAt: t0}, "x", t0)
		}
	})
	if n := k.set.Len(); n != before+50 {
		t.Fatalf("%d breakers, want %d", n, before+50)
	}
	// a retry held behind one of them: that one is kept
	heldRef := breaker.Ref{Scope: breaker.ProviderModel, Key: "held/model"}
	step(k, t0, true, func(b *testBatch) {
		k.set.Trip(heldRef, "x", breaker.Outcome{}, t0)
		k.set.Reset(heldRef, "x", t0)
		k.set.Adopt(heldRef, breaker.Shared{State: breaker.Open, OpenedAt: t0}, "x", t0)
		k.held.put("t-held", 0, []breaker.Ref{heldRef})
	})
	idle := k.set.Idle(breaker.ProviderModel)
	later := t0.Add(idle + expireEvery + time.Second)
	b := step(k, later, true, nil)
	if n := k.set.Len(); n != 2 || !k.set.Latched(tplRef) || k.set.State(heldRef) != breaker.Open {
		t.Fatalf("%d breakers after %s unused (latched template kept: %v, the one a retry is held behind: %s), want those two",
			n, idle, k.set.Latched(tplRef), k.set.State(heldRef))
	}
	tombs := 0
	for _, rec := range b.out {
		if rec.Topic == "breakers" && rec.Value == nil && strings.HasPrefix(string(rec.Key), "PROVIDER_MODEL/gone/") {
			tombs++
		}
	}
	if tombs != len(refs) {
		t.Fatalf("letting go of %d OPEN breakers wrote %d tombstones of their keys, want %d", len(refs), tombs, len(refs))
	}
}

// staleTable makes k's breakers table stale: its reader has read nothing
// for a minute. freshTable makes it read on to a new listing.
func staleTable(k *Breakers) { k.table.freshAt = time.Now().Add(-time.Minute) }

func freshTable(k *Breakers) { k.table.freshAt = time.Now().Add(time.Hour) }

// openOnSharedState returns breakers whose template is OPEN, not latched,
// on the state instance c shared, adopted in a committed batch at t0.
func openOnSharedState(t *testing.T) (*Breakers, time.Time) {
	t.Helper()
	k := adoptBreakers(t)
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)
	feed(k, stateRec(t, tplRef, breaker.Open.Name(), "c", false, t0))
	step(k, t0, true, nil)
	if k.set.State(tplRef) != breaker.Open || k.set.Latched(tplRef) {
		t.Fatalf("the template is %s (latched %v), want OPEN on c's state", k.set.State(tplRef), k.set.Latched(tplRef))
	}
	return k, t0
}

// Guards the letting go of an unused template with a stale breakers
// table: like a release by adoption, it waits for a fresh table, which
// may hold an item that latches it.
func TestAStaleTableKeepsAnUnusedTemplate(t *testing.T) {
	k, t0 := openOnSharedState(t)
	later := t0.Add(k.set.IdleOf(tplRef) + expireEvery + time.Second)
	staleTable(k)
	step(k, later, true, nil)
	if k.set.State(tplRef) != breaker.Open || len(k.events) != 0 {
		t.Fatalf("with the table stale, the unused template is %s, transitions %+v; want OPEN, none", k.set.State(tplRef), k.events)
	}
	freshTable(k)
	step(k, later.Add(expireEvery), true, nil)
	if k.set.State(tplRef) != breaker.Closed || len(k.events) != 1 || k.events[0].To != breaker.Closed.Name() {
		t.Fatalf("with the table fresh, the unused template is %s, transitions %+v; want let go, CLOSED once", k.set.State(tplRef), k.events)
	}
}

// Guards the records an earlier release wrote by key to the breakers
// topic's other partitions: read as written before partition 0's, an
// item there is ended by a RESET on partition 0, and its decision (a
// tombstone there) ends the item wherever it was opened.
func TestEarlierReleasesPartitionsComeFirst(t *testing.T) {
	k := adoptBreakers(t)
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)
	feedLegacy(k, itemRec(t, "h-old", "old", true), 2, 900)
	step(k, t0, true, nil)
	if !k.set.Latched(tplRef) {
		t.Fatal("an earlier release's item did not latch the template")
	}
	feed(k, resetRec(t, tplRef, "ops")) // partition 0, offset 0
	step(k, t0.Add(time.Second), true, nil)
	if k.set.Latched(tplRef) {
		t.Fatal("a RESET on partition 0 did not end an item an earlier release wrote to partition 2 at a higher offset")
	}

	readBack(k, hallucinate(t, k, "h-2", "tpl", t0.Add(2*time.Second)))
	feedLegacy(k, itemRec(t, "h-2", "old", false), 1, 3)
	step(k, t0.Add(3*time.Second), true, nil)
	if k.set.Latched(tplRef) {
		t.Fatal("an earlier release's decision of an item (a tombstone on partition 1) did not end it")
	}
}

// Guards an earlier release's item read after the decision this release
// wrote of it (a rollback, then forward again): the earlier release opened
// the item on partition 2; an instance of this release decided it, its
// tombstone on partition 0; an instance that starts reads partition 0
// before partition 2. The template is not latched, and it stays so once a
// RESET came and its tombstone went (the RESET forgotten).
func TestAnEarlierReleasesItemReadAfterItsDecisionDoesNotLatch(t *testing.T) {
	k := adoptBreakers(t)
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)
	feed(k, itemRec(t, "h-old", "a", false))             // partition 0: the decision
	feedLegacy(k, itemRec(t, "h-old", "b", true), 2, 23) // the item, read after
	step(k, t0, true, nil)
	if k.set.Latched(tplRef) {
		t.Fatal("an earlier release's item, read after its decision's tombstone, latched the template")
	}
	reset := resetRec(t, tplRef, "ops")
	feed(k, reset)
	step(k, t0.Add(time.Second), true, nil)
	tomb := &kgo.Record{Key: reset.Key, Headers: []kgo.RecordHeader{{Key: codec.HeaderBreakerInstance, Value: []byte("a")},
		{Key: codec.HeaderBreakerResetOffset, Value: []byte(strconv.FormatInt(reset.Offset, 10))}}}
	feed(k, tomb)
	step(k, t0.Add(2*time.Second), true, nil)
	if k.set.Latched(tplRef) {
		t.Fatal("the template latched once its RESET was forgotten, by an item decided before it")
	}
}

// Guards an earlier release's failure-rate states read after newer ones of
// partition 0 (a restart reads the partitions in whatever order its fetches
// bring them): the earlier release's OPEN of a model on partition 2 comes
// before every record of partition 0 in the topic's order, so the CLOSED
// (a tombstone) this release wrote of it there stands, and so does a
// person's RESET; the breaker is not opened by the stale OPEN, nor closed by
// a stale RESET. An earlier release's OPEN of a breaker partition 0 has no
// record of is adopted.
func TestAnEarlierReleasesStateReadAfterANewerOneIsOlder(t *testing.T) {
	k := adoptBreakers(t)
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)
	closed := breaker.Ref{Scope: breaker.ProviderModel, Key: "acme/m1"}
	reset := breaker.Ref{Scope: breaker.ProviderModel, Key: "acme/m2"}
	fresh := breaker.Ref{Scope: breaker.ProviderModel, Key: "acme/m3"}
	feed(k, stateRec(t, closed, breaker.Open.Name(), "a", false, t0.Add(-time.Minute)))
	feed(k, stateRec(t, closed, breaker.Closed.Name(), "a", false, t0))
	feed(k, resetRec(t, reset, "ops"))
	feedLegacy(k, stateRec(t, closed, breaker.Open.Name(), "old", false, t0.Add(time.Second)), 2, 40)
	feedLegacy(k, stateRec(t, reset, breaker.Open.Name(), "old", false, t0.Add(time.Second)), 1, 41)
	feedLegacy(k, stateRec(t, fresh, breaker.Open.Name(), "old", false, t0.Add(time.Second)), 2, 42)
	step(k, t0.Add(2*time.Second), true, nil)
	if got := k.set.State(closed); got != breaker.Closed {
		t.Errorf("%v is %v, want CLOSED: an earlier release's OPEN read after this release's CLOSED of it was applied over it", closed, got)
	}
	if got := k.set.State(reset); got != breaker.Closed {
		t.Errorf("%v is %v, want CLOSED: an earlier release's OPEN read after a RESET of it was applied over it", reset, got)
	}
	if got := k.set.State(fresh); got != breaker.Open {
		t.Errorf("%v is %v, want OPEN: an earlier release's OPEN of a breaker partition 0 says nothing of was not adopted", fresh, got)
	}
	// a RESET an earlier release wrote to partition 1, read after an OPEN
	// of partition 0, does not close it
	opened := breaker.Ref{Scope: breaker.ProviderModel, Key: "acme/m4"}
	feed(k, stateRec(t, opened, breaker.Open.Name(), "a", false, t0.Add(2*time.Second)))
	feedLegacy(k, resetRec(t, opened, "ops"), 1, 43)
	step(k, t0.Add(2500*time.Millisecond), true, nil)
	if got := k.set.State(opened); got != breaker.Open {
		t.Errorf("%v is %v, want OPEN: an earlier release's RESET read after an OPEN of partition 0 closed it", opened, got)
	}
	// what partition 0 says after it still counts
	feed(k, stateRec(t, closed, breaker.Open.Name(), "a", false, t0.Add(3*time.Second)))
	step(k, t0.Add(4*time.Second), true, nil)
	if got := k.set.State(closed); got != breaker.Open {
		t.Errorf("%v is %v, want OPEN: a newer OPEN on partition 0 was not adopted", closed, got)
	}
}

// Guards an earlier release's OPEN that compaction would keep for ever on
// its partition (nothing of this release's is written there): once the
// breaker adopted from it closes here (let go when unused), the CLOSED is
// written on partition 0 and a tombstone of the key on the earlier
// release's partition, so that an instance that starts once compaction has
// run (partition 0's tombstone gone too) does not open the breaker again
// on that OPEN.
func TestAnEarlierReleasesOpenIsTombstonedWhereItWasWritten(t *testing.T) {
	k := adoptBreakers(t)
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)
	ref := breaker.Ref{Scope: breaker.ProviderModel, Key: "acme/retired"}
	legacyOpen := stateRec(t, ref, breaker.Open.Name(), "old", false, t0.Add(-time.Hour))
	feedLegacy(k, legacyOpen, 2, 7)
	step(k, t0, true, nil)
	if got := k.set.State(ref); got != breaker.Open {
		t.Fatalf("%v is %v, want OPEN: an earlier release's OPEN, the breaker's only record, was not adopted", ref, got)
	}
	b := step(k, t0.Add(k.set.Idle(ref.Scope)+2*expireEvery), true, nil)
	if got := k.set.State(ref); got != breaker.Closed {
		t.Fatalf("%v is %v once unused for its idle time, want CLOSED (let go)", ref, got)
	}
	// the topic as compaction leaves it, by partition and key: the
	// records of the batch that let the breaker go, after the earlier
	// release's OPEN
	type pk struct {
		p   int32
		key string
	}
	last := map[pk]*kgo.Record{{2, string(legacyOpen.Key)}: legacyOpen}
	var tombs []int32
	for _, rec := range b.out {
		if rec.Topic == "breakers" && string(rec.Key) == string(legacyOpen.Key) {
			if rec.Value != nil {
				t.Fatalf("the batch that let %v go wrote a live state on partition %d", ref, rec.Partition)
			}
			tombs = append(tombs, rec.Partition)
			last[pk{rec.Partition, string(rec.Key)}] = rec
		}
	}
	if !slices.Equal(tombs, []int32{0, 2}) {
		t.Errorf("the batch that let %v go wrote its key's tombstones on partitions %v, want [0 2]: partition 0's, and one where the earlier release's OPEN is", ref, tombs)
	}
	fresh := adoptBreakers(t)
	for at, rec := range last {
		if rec.Value == nil {
			continue // a tombstone past its retention
		}
		c := *rec
		if at.p == 0 {
			feed(fresh, &c)
		} else {
			feedLegacy(fresh, &c, at.p, 7)
		}
	}
	step(fresh, t0.Add(48*time.Hour), true, nil)
	if got := fresh.set.State(ref); got != breaker.Closed {
		t.Errorf("an instance that started on the compacted topic has %v %v, want CLOSED: the earlier release's OPEN was left on partition 2", ref, got)
	}
	// the tombstone read back: the earlier release's OPEN is no longer
	// the last record of its partition, and a later CLOSED writes none
	for _, rec := range b.out {
		if rec.Topic == "breakers" && rec.Partition == 2 {
			c := *rec
			feedLegacy(k, &c, 2, 8)
		}
	}
	if _, live := k.table.legacyLive[ref]; live {
		t.Errorf("the earlier release's OPEN of %v is still counted live once its tombstone was read", ref)
	}
}

// Guards the order a batch applies what it read: latches before states. A
// template OPEN here on its failure rate, whose latch item and another
// instance's CLOSED arrive together, stays OPEN and is latched, with no
// CLOSED transition in between (a CLOSED of a template an item holds would
// tell the alerts topic, and the console, that it reopened).
func TestLatchesApplyBeforeStates(t *testing.T) {
	k := adoptBreakers(t)
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)
	feed(k, stateRec(t, tplRef, breaker.Open.Name(), "c", false, t0))
	step(k, t0, true, nil)
	if k.set.State(tplRef) != breaker.Open || k.set.Latched(tplRef) {
		t.Fatalf("the template is %s (latched %v), want OPEN, not latched", k.set.State(tplRef), k.set.Latched(tplRef))
	}
	feed(k, itemRec(t, "h-1", "a", true), stateRec(t, tplRef, breaker.Closed.Name(), "c", false, t0.Add(time.Second)))
	step(k, t0.Add(2*time.Second), true, nil)
	if !k.set.Latched(tplRef) {
		t.Fatal("the template is not latched by h-1's item")
	}
	for _, e := range k.events {
		if e.To == breaker.Closed.Name() {
			t.Fatalf("the batch closed the template on its way to the latch: %+v", k.events)
		}
	}
}

// Guards the tombstones of items a RESET ended, written by the owner of the
// task's partition: an instance that was just assigned the partition, and
// has not read the breakers topic to where it stood then, may not have read
// a newer item of the same task (same key), written by the previous owner
// after the RESET. It writes no tombstone until it has: that one would end
// the newer item and reopen the template while it is undecided.
func TestNoItemTombstoneBeforeTheTableIsCurrent(t *testing.T) {
	k := adoptBreakers(t)
	tb := k.table
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)
	feed(k, itemRec(t, "h-9", "a", true), resetRec(t, tplRef, "ops"))
	// the partition is assigned: the table must read two more records
	tb.mu.Lock()
	tb.target = map[int32]int64{0: tb.read[0] + 2}
	tb.mu.Unlock()
	b := step(k, t0, true, nil)
	if _, decided := itemRecords(b); decided != 0 {
		t.Fatalf("an instance behind its assignment's target wrote %d item tombstones", decided)
	}
	// a's newer item of h-9, and the RESET's end of the old one read; now current
	feed(k, itemRec(t, "h-9", "a", true), stateRec(t, breaker.Ref{Scope: breaker.ProviderModel, Key: "p/m"}, breaker.Closed.Name(), "a", false, t0))
	b = step(k, t0.Add(time.Second), true, nil)
	readBack(k, b)
	if _, decided := itemRecords(b); decided != 0 {
		t.Fatalf("the batch wrote %d item tombstones once current, want none: h-9's item is open again", decided)
	}
	step(k, t0.Add(2*time.Second), true, nil)
	if !k.set.Latched(tplRef) {
		t.Fatal("a's newer item of h-9 does not hold the template")
	}
}

// Guards the tombstone of a RESET no item needs any more: written for the
// RESET this instance read, it reaches the readers after a newer RESET
// that a person wrote meanwhile, which ended a newer item. The newer RESET
// stays: the item it ended does not hold the template again.
func TestARESETTombstoneKeepsANewerRESET(t *testing.T) {
	k := adoptBreakers(t)
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)
	feed(k, itemRec(t, "h-1", "a", true), resetRec(t, tplRef, "ops"))
	readBack(k, step(k, t0, true, nil)) // h-1's tombstone
	b := step(k, t0.Add(time.Second), true, nil)
	if n := len(b.out); n != 1 || !strings.HasPrefix(string(b.out[0].Key), event.BreakerResetPrefix) || b.out[0].Value != nil {
		t.Fatalf("the batch wrote %v, want the obsolete RESET's tombstone", b.out)
	}
	// before it is read back: a newer item, and a person's newer RESET
	feed(k, itemRec(t, "h-2", "a", true), resetRec(t, tplRef, "ops"))
	readBack(k, b)
	step(k, t0.Add(2*time.Second), true, nil)
	if k.set.Latched(tplRef) {
		t.Fatal("the tombstone of the older RESET removed the newer one: h-2's item, which it ended, latched the template again")
	}
}

// Guards the release of a latch by an instance whose breakers table is
// stale (its reader held back by a broker it waits for, or a starved
// process): another instance's item of the template, committed a while
// ago, may be missing from it. Deciding the last item the table knows of
// writes its tombstone but does not reopen the template; once the table is
// fresh again, the next batch reopens it (no item holds it), once.
func TestAStaleTableKeepsTheTemplateLatched(t *testing.T) {
	k := adoptBreakers(t)
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)
	readBack(k, hallucinate(t, k, "h-1", "tpl", t0))
	if !k.set.Latched(tplRef) {
		t.Fatal("a hallucination did not latch its template")
	}

	staleTable(k)
	b := decideItem(t, k, "h-1", "tpl", t0.Add(time.Second), true)
	if _, decided := itemRecords(b); decided != 1 {
		t.Fatalf("deciding the item wrote %d tombstones, want 1", decided)
	}
	if !k.set.Latched(tplRef) || len(k.events) != 0 {
		t.Fatalf("deciding the last item the stale table knows of left the template latched %v, transitions %+v; want latched, none",
			k.set.Latched(tplRef), k.events)
	}
	readBack(k, b)
	step(k, t0.Add(2*time.Second), true, nil)
	if !k.set.Latched(tplRef) {
		t.Fatal("a batch with the table still stale reopened the template")
	}

	freshTable(k)
	step(k, t0.Add(3*time.Second), true, nil)
	if k.set.State(tplRef) != breaker.Closed {
		t.Fatalf("once the table is fresh the template is %s, want CLOSED", k.set.State(tplRef))
	}
	if len(k.events) != 1 || k.events[0].To != breaker.Closed.Name() {
		t.Fatalf("once the table is fresh the batch queued %+v, want one CLOSED transition", k.events)
	}
	step(k, t0.Add(4*time.Second), true, nil)
	if len(k.events) != 0 {
		t.Fatalf("the batch after it queued %+v, want nothing", k.events)
	}
}

// Guards the release of a template by adoption on an instance whose
// breakers table is stale: the template is OPEN here on a state another
// instance shared, and a third instance's CLOSED of it comes in while the
// reader is held back (a broker restart, a paused process). An item that
// latches the template may be committed after that CLOSED and not read
// yet, so the CLOSED waits for a fresh table: the template stays OPEN, with
// no transition, and once the table is fresh it is adopted, unless an item
// read meanwhile latches the template, which then never reopens.
func TestAStaleTableDoesNotReleaseATemplateByAdoption(t *testing.T) {
	for _, item := range []bool{false, true} {
		k, t0 := openOnSharedState(t)

		staleTable(k)
		feed(k, stateRec(t, tplRef, breaker.Closed.Name(), "a", false, t0.Add(time.Second)))
		step(k, t0.Add(2*time.Second), true, nil)
		step(k, t0.Add(3*time.Second), false, nil) // one that does not commit
		step(k, t0.Add(4*time.Second), true, nil)
		if k.set.State(tplRef) != breaker.Open || len(k.events) != 0 {
			t.Fatalf("with the table stale, a's CLOSED left the template %s, transitions %+v; want OPEN, none", k.set.State(tplRef), k.events)
		}

		if item {
			feed(k, itemRec(t, "h-1", "c", true)) // committed after a's CLOSED
		}
		freshTable(k)
		step(k, t0.Add(5*time.Second), true, nil)
		if item {
			if !k.set.Latched(tplRef) {
				t.Fatal("c's item read with the table fresh does not latch the template")
			}
			for _, e := range k.events {
				if e.To == breaker.Closed.Name() {
					t.Fatalf("the batch closed the template an item latches: %+v", k.events)
				}
			}
			continue
		}
		if k.set.State(tplRef) != breaker.Closed || len(k.events) != 1 || k.events[0].To != breaker.Closed.Name() {
			t.Fatalf("once the table is fresh the template is %s, transitions %+v; want CLOSED, one", k.set.State(tplRef), k.events)
		}
		step(k, t0.Add(6*time.Second), true, nil)
		if len(k.events) != 0 {
			t.Fatalf("the batch after it queued %+v, want nothing", k.events)
		}
	}
}

// compacted is what a compacted topic keeps of recs once the cleaner has
// run and the tombstones' retention passed: the last record of each key,
// unless it is a tombstone. A restarted or new instance reads only that.
// topicLog is the breakers topic a test writes, fed to k as it grows.
type topicLog struct {
	k    *Breakers
	recs []*kgo.Record
}

// in appends recs to the topic, and k reads them.
func (l *topicLog) in(recs ...*kgo.Record) {
	feed(l.k, recs...)
	l.recs = append(l.recs, recs...)
}

// batches runs n committed batches of k, a second apart after at, each
// one's records read back and appended to the topic.
func (l *topicLog) batches(at time.Time, n int) {
	for i := range n {
		b := step(l.k, at.Add(time.Duration(i+1)*time.Second), true, nil)
		readBack(l.k, b)
		for _, rec := range b.out {
			if rec.Topic == "breakers" {
				l.recs = append(l.recs, rec)
			}
		}
	}
}

// readCompacted returns a new instance that read, in offset order, what
// compaction keeps of the topic, after its first batch at at.
func (l *topicLog) readCompacted(t *testing.T, at time.Time) *Breakers {
	t.Helper()
	kept := compacted(l.recs)
	fresh := adoptBreakers(t)
	for _, rec := range l.recs {
		if kept[string(rec.Key)] == rec {
			feed(fresh, rec)
		}
	}
	step(fresh, at, true, nil)
	return fresh
}

func compacted(recs []*kgo.Record) map[string]*kgo.Record {
	last := map[string]*kgo.Record{}
	for _, rec := range recs {
		last[string(rec.Key)] = rec
	}
	for key, rec := range last {
		if rec.Value == nil {
			delete(last, key)
		}
	}
	return last
}

// Guards a person's RESET of a failure-rate breaker against compaction:
// the OPEN state another instance shared before the RESET must not come
// back, once the RESET is tombstoned (no item needs it) and the cleaner ran,
// for an instance that reads the topic anew. Either the state record is
// gone from what the topic keeps, or the RESET that ends it stays.
func TestAResetOpenStaysResetOnceCompacted(t *testing.T) {
	k := adoptBreakers(t)
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)
	ref := breaker.Ref{Scope: breaker.ProviderModel, Key: "p/m"}
	topic := &topicLog{k: k}
	topic.in(stateRec(t, ref, breaker.Open.Name(), "a", false, t0))
	step(k, t0, true, nil)
	if k.set.State(ref) != breaker.Open {
		t.Fatalf("the OPEN shared by a is %s here, want OPEN", k.set.State(ref))
	}
	topic.in(resetRec(t, ref, "ops"))
	topic.batches(t0, 3) // the RESET, then what the batches after it tidy
	if k.set.State(ref) != breaker.Closed {
		t.Fatalf("after the RESET the breaker is %s, want CLOSED", k.set.State(ref))
	}
	kept := compacted(topic.recs)
	_, resetKept := kept[event.BreakerResetKey(ref.Scope.Name(), ref.Key)]
	st, stateKept := kept[event.BreakerStateKey(ref.Scope.Name(), ref.Key)]
	if stateKept && !resetKept {
		s, _ := event.DecodeBreakerState(st.Value)
		t.Fatalf("once compacted, the topic keeps a's %s state of %s and not the RESET after it: a new instance adopts it again", s.State, ref)
	}
	// and neither stays for good: the topic's live keys are what holds
	if stateKept || resetKept {
		t.Errorf("once compacted, the topic keeps the state of %s (%v) or its RESET (%v), though nothing holds the breaker any more", ref, stateKept, resetKept)
	}

	// a new instance reading what the cleaner kept has the breaker CLOSED
	if fresh := topic.readCompacted(t, t0.Add(10*time.Second)); fresh.set.State(ref) != breaker.Closed {
		t.Fatalf("a new instance reading the compacted topic has %s %s, want CLOSED: the RESET was undone", ref, fresh.set.State(ref))
	}
}

// derivedAfter marks rec as derived after the RESET at offset r (-1: none
// applied), as this release writes its state records.
func derivedAfter(rec *kgo.Record, r int64) *kgo.Record {
	rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: codec.HeaderBreakerAfterReset, Value: []byte(strconv.FormatInt(r, 10))})
	return rec
}

// Guards a person's RESET against a state its writer derived before it
// read the RESET: a's OPEN breaker half-opens on a (its cooldown over) just
// as a person resets it, and a's HALF_OPEN lands after the RESET on the
// topic. The RESET stands, on every instance and for one that reads the
// compacted topic anew; a state derived after the RESET applies as always.
func TestAStateDerivedBeforeAResetDoesNotUndoIt(t *testing.T) {
	k := adoptBreakers(t)
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)
	ref := breaker.Ref{Scope: breaker.ProviderModel, Key: "p/m"}
	topic := &topicLog{k: k}
	topic.in(derivedAfter(stateRec(t, ref, breaker.Open.Name(), "a", false, t0), -1))
	step(k, t0, true, nil)
	if k.set.State(ref) != breaker.Open {
		t.Fatalf("a's OPEN is %s here, want OPEN", k.set.State(ref))
	}
	reset := resetRec(t, ref, "ops")
	topic.in(reset)
	topic.in(derivedAfter(stateRec(t, ref, breaker.HalfOpen.Name(), "a", false, t0.Add(time.Minute)), -1))
	topic.batches(t0.Add(time.Minute), 4) // the RESET, then what the batches after it tidy
	if k.set.State(ref) != breaker.Closed {
		t.Fatalf("after the RESET and a's HALF_OPEN derived before it, the breaker is %s, want CLOSED", k.set.State(ref))
	}
	if fresh := topic.readCompacted(t, t0.Add(2*time.Minute)); fresh.set.State(ref) != breaker.Closed {
		t.Fatalf("a new instance reading the compacted topic has %s %s, want CLOSED: the RESET was undone", ref, fresh.set.State(ref))
	}

	// a state derived after the RESET opens the breaker again
	topic.in(derivedAfter(stateRec(t, ref, breaker.Open.Name(), "a", false, t0.Add(3*time.Minute)), reset.Offset))
	step(k, t0.Add(3*time.Minute), true, nil)
	if k.set.State(ref) != breaker.Open {
		t.Fatalf("an OPEN derived after the RESET is %s here, want OPEN", k.set.State(ref))
	}
}

// The same race on the instance whose cooldown ended: its own HALF_OPEN,
// in flight when it reads the RESET, does not keep the RESET from it.
func TestAResetReadOverOwnStaleStateCloses(t *testing.T) {
	k := adoptBreakers(t)
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)
	ref := breaker.Ref{Scope: breaker.ProviderModel, Key: "p/m"}
	own := step(k, t0, true, func(b *testBatch) {
		k.set.Adopt(ref, breaker.Shared{State: breaker.HalfOpen}, "cooldown over", t0)
		k.share(ref, "cooldown over", b, t0)
	})
	feed(k, resetRec(t, ref, "ops"))
	readBack(k, own) // after the RESET on the topic
	step(k, t0.Add(time.Second), true, nil)
	if k.set.State(ref) != breaker.Closed {
		t.Fatalf("a RESET read while this instance's HALF_OPEN was in flight left the breaker %s, want CLOSED", k.set.State(ref))
	}
}
