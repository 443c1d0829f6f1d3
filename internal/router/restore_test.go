package router

import (
	"io"
	"log/slog"
	"testing"

	"github.com/faultrouter/faultrouter/internal/store"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/task"
)

const rsHour = int64(3_600_000) // an hour, in ms

// rsWorld is a router with a real Pebble store and no Kafka.
type rsWorld struct {
	t *testing.T
	r *Router
}

func rsStart(t *testing.T) *rsWorld {
	t.Helper()
	c, err := codec.New()
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := store.Open(t.TempDir(), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &rsWorld{t: t, r: &Router{log: log, codec: c, store: s, metrics: newMetrics(nil)}}
}

// put writes st into partition p of the store, with its index entries, as
// a restore of a partition it wiped writes its changelog state.
func (w *rsWorld) put(p int32, st *task.State) {
	w.t.Helper()
	wb := w.r.store.NewBatch()
	if err := wb.Put(p, nil, st, st.ExpiresAt); err != nil {
		w.t.Fatal(err)
	}
	if err := wb.Commit(); err != nil {
		w.t.Fatal(err)
	}
}

// Guards the states a batch starts from after a rebalance: the batch before
// hands the next one the states it committed (statesBefore) only while no
// assignment has changed since its commit. A partition revoked and assigned
// again may have been restored with states another instance committed
// meanwhile; the next batch must read those from the store, not the stale
// ones of the batch before.
func TestBatchAfterARebalanceReadsTheStore(t *testing.T) {
	w := rsStart(t)
	put := func(st *task.State) {
		wb := w.r.store.NewBatch()
		if err := wb.Put(0, nil, st, 5*rsHour); err != nil {
			t.Fatal(err)
		}
		if err := wb.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	prev := newBatch()
	prev.isTouched["t"] = true
	v, err := w.r.codec.EncodeState(nil, &task.State{TaskID: "t", Attempts: 2})
	if err != nil {
		t.Fatal(err)
	}
	prev.encoded["t"] = v
	prev.rebalances = w.r.rebalances.Load()
	put(&task.State{TaskID: "t", Attempts: 1}) // the store before prev's write

	b := newBatch()
	b.ids = []string{"t"}
	ids, err := w.r.statesBefore(prev, b)
	if err != nil {
		t.Fatal(err)
	}
	if st := b.states["t"]; len(ids) != 0 || st == nil || st.Attempts != 2 {
		t.Fatalf("no rebalance: state %+v and %v left to read, want the batch before's state (attempts 2) and none", st, ids)
	}

	// a rebalance: the partition was restored with another instance's state
	w.r.rebalances.Add(1)
	put(&task.State{TaskID: "t", Attempts: 7})
	b = newBatch()
	b.ids = []string{"t"}
	if ids, err = w.r.statesBefore(prev, b); err != nil {
		t.Fatal(err)
	}
	if err := w.r.store.Load(ids, func(string) int32 { return 0 }, b.states); err != nil {
		t.Fatal(err)
	}
	if st := b.states["t"]; st == nil || st.Attempts != 7 {
		t.Fatalf("after a rebalance: state %+v, want the store's (attempts 7), not the batch before's", st)
	}
}

// Guards the sweep's index repair against a restore that runs meanwhile
// (the assignment callbacks restore while the run loop routes a batch). A
// visit reads a due-index entry; a restore wipes the partition before the
// visit reads the entry's state, so the state is gone and the entry looks
// stale; the restore then writes the state back with the same pending retry
// and entry. The repair must not delete that entry: the retry would never
// be published.
func TestIndexRepairDoesNotUndoARestore(t *testing.T) {
	w := rsStart(t)
	st := &task.State{TaskID: "due", Attempts: 1, Pending: &task.PendingRetry{N: 1, DelayMs: 1000, NotBefore: 1_000}, ExpiresAt: 5 * rsHour}
	w.put(0, st)

	var once bool
	afterIndexScan = func(p int32) {
		if once {
			return
		}
		// a partition assigned again whose local state is not trusted: the
		// callback takes the lock, counts the rebalance and wipes it
		w.r.written.Lock()
		w.r.rebalances.Add(1)
		if _, err := w.r.store.WipePartition(p); err != nil {
			t.Error(err)
		}
	}
	beforeIndexRepair = func(p int32) {
		if once {
			return
		}
		once = true
		// ... and restores the same state from the changelog
		w.put(p, st)
		w.r.written.Unlock()
	}
	t.Cleanup(func() { afterIndexScan, beforeIndexRepair = nil, nil })

	b := newBatch()
	swp := newSweeper(&w.r.cfg, w.r.log, w.r.store, w.r, nil)
	err := swp.visit(b, store.DueIndex, 0, 2_000, func(st *task.State, d store.Due, inBatch bool) bool {
		return inBatch || dueMatches(st, d)
	})
	if err != nil {
		t.Fatal(err)
	}
	if !once {
		t.Fatal("the visit found no stale entry: the interleaving did not happen")
	}
	if ds, err := w.r.store.Scan(store.DueIndex, 0, 1<<50, 1000); err != nil || len(ds) != 1 || ds[0].TaskID != "due" || ds[0].NotBefore != 1000 {
		t.Errorf("due index after the repair %v (%v), want due@1000: the restored retry's entry was deleted", ds, err)
	}
	if st, err := w.r.store.Get(0, "due"); err != nil || st == nil || st.Pending == nil {
		t.Errorf("restored state %+v (%v), want its pending retry", st, err)
	}
}
