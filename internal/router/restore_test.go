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
	pt := prev.task("t", 0)
	prev.touchTask(pt)
	v, err := w.r.codec.EncodeState(nil, &task.State{TaskID: "t", Attempts: 2})
	if err != nil {
		t.Fatal(err)
	}
	pt.encoded = v
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
