package sweep

import (
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/store"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// testOwner owns partition 0; its lock and count of rebalances are the
// router's assignment callbacks'.
type testOwner struct {
	mu         sync.Mutex
	rebalances atomic.Uint64
}

func (o *testOwner) OwnedPartitions() []int32 { return []int32{0} }

func (o *testOwner) RebalanceCount() uint64 { return o.rebalances.Load() }

func (o *testOwner) UnlessRebalanced(since uint64, fn func() error) error {
	if !o.mu.TryLock() {
		return nil
	}
	defer o.mu.Unlock()
	if o.rebalances.Load() != since {
		return nil
	}
	return fn()
}

// testBatch is a batch as the router's holds what the sweep works on.
type testBatch struct {
	states    map[string]*task.State
	forgotten map[string]bool
	expired   []Expired
	out       []*kgo.Record
}

func newTestBatch() *testBatch {
	return &testBatch{states: map[string]*task.State{}, forgotten: map[string]bool{}}
}

func (b *testBatch) States() map[string]*task.State { return b.states }
func (b *testBatch) Touched(id string) bool         { return false }
func (b *testBatch) Load(st *task.State, _ int32)   { b.states[st.TaskID] = st }
func (b *testBatch) Remember(*task.State)           {}
func (b *testBatch) Forgotten(id string) bool       { return b.forgotten[id] }
func (b *testBatch) Expired() []Expired             { return b.expired }
func (b *testBatch) Queue(rec *kgo.Record)          { b.out = append(b.out, rec) }

func (b *testBatch) Expire(p int32, st *task.State, tombstone *kgo.Record) {
	b.forgotten[st.TaskID] = true
	b.out = append(b.out, tombstone)
	b.expired = append(b.expired, Expired{Partition: p, State: st})
}

// world is a sweep of a real Pebble store.
type world struct {
	t       *testing.T
	store   *store.Store
	owner   *testOwner
	sweeper *Sweeper
}

func start(t *testing.T) *world {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := store.Open(t.TempDir(), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	o := &testOwner{}
	return &world{t: t, store: s, owner: o, sweeper: New(policy.Default(), "state", log, s, o, nil)}
}

// put writes st into partition p of the store, with its index entries, as
// a restore of a partition it wiped writes its changelog state.
func (w *world) put(p int32, st *task.State) {
	w.t.Helper()
	wb := w.store.NewBatch()
	if err := wb.Put(p, nil, st, st.ExpiresAt); err != nil {
		w.t.Fatal(err)
	}
	if err := wb.Commit(); err != nil {
		w.t.Fatal(err)
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
	w := start(t)
	st := &task.State{TaskID: "due", Attempts: 1, Pending: &task.PendingRetry{N: 1, DelayMs: 1000, NotBefore: 1_000}, ExpiresAt: 5 * 3_600_000}
	w.put(0, st)

	var once bool
	afterIndexScan = func(p int32) {
		if once {
			return
		}
		// a partition assigned again whose local state is not trusted: the
		// callback takes the lock, counts the rebalance and wipes it
		w.owner.mu.Lock()
		w.owner.rebalances.Add(1)
		if _, err := w.store.WipePartition(p); err != nil {
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
		w.owner.mu.Unlock()
	}
	t.Cleanup(func() { afterIndexScan, beforeIndexRepair = nil, nil })

	b := newTestBatch()
	err := w.sweeper.visit(b, store.DueIndex, 0, 2_000, func(st *task.State, d store.Due, inBatch bool) bool {
		return inBatch || dueMatches(st, d)
	})
	if err != nil {
		t.Fatal(err)
	}
	if !once {
		t.Fatal("the visit found no stale entry: the interleaving did not happen")
	}
	if ds, err := w.store.Scan(store.DueIndex, 0, 1<<50, 1000); err != nil || len(ds) != 1 || ds[0].TaskID != "due" || ds[0].NotBefore != 1000 {
		t.Errorf("due index after the repair %v (%v), want due@1000: the restored retry's entry was deleted", ds, err)
	}
	if st, err := w.store.Get(0, "due"); err != nil || st == nil || st.Pending == nil {
		t.Errorf("restored state %+v (%v), want its pending retry", st, err)
	}
}
