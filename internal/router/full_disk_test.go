package router

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/faultrouter/faultrouter/internal/store"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// noSpace is the error a write to a full volume returns.
type noSpace struct{ path string }

func (e *noSpace) Error() string { return "write " + e.path + ": no space left on device" }
func (e *noSpace) Unwrap() error { return syscall.ENOSPC }

// Guards a full disk under one instance's state directory: the instance's
// store fails at the first write, flush or compaction that finds no space,
// the instance says not ready, ends its session (which leaves the group)
// and Run returns the store's error, instead of running on while Pebble
// retries the flush and every write waits. The other instance takes its
// partitions and restores them from the changelog: every event, before and
// after, is decided once. A failing disk (EIO on every flush) stops it the
// same way once the flushes have failed for the store's FlushFailLimit.
func TestAFullDiskStopsTheInstanceAndItsPartitionsMove(t *testing.T) {
	t.Run("full", func(t *testing.T) {
		testABrokenDiskStopsTheInstance(t, func(path string) error { return &noSpace{path: path} }, syscall.ENOSPC)
	})
	t.Run("failing", func(t *testing.T) {
		testABrokenDiskStopsTheInstance(t, func(string) error { return syscall.EIO }, syscall.EIO)
	})
}

func testABrokenDiskStopsTheInstance(t *testing.T, fault func(path string) error, cause error) {
	w := lcStart(t, 4)
	var full atomic.Bool
	fs := errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if full.Load() && op.Kind.ReadOrWrite() == errorfs.OpIsWrite && strings.HasSuffix(op.Path, ".sst") {
			return fault(op.Path)
		}
		return nil
	}))
	cfg := w.config("a")
	cfg.storeOptions = func(o *store.Options) {
		o.FS = fs
		o.MemTableSize = 256 << 10 // a few hundred states fill it: its flush meets the broken disk
		o.FlushFailLimit = 2 * time.Second
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	b := w.start("b", nil)
	if !lcWaitFor(60*time.Second, func() bool {
		return a.Ready() && b.Ready() && len(a.ownedPartitions()) > 0 && len(b.ownedPartitions()) > 0
	}) {
		t.Fatalf("a and b not both ready with partitions within 60 s (a %v, b %v)", a.ownedPartitions(), b.ownedPartitions())
	}
	aHad := a.ownedPartitions()

	valid, conf := true, 0.95
	var ids []string
	produce := func(from, n int) {
		for i := from; i < from+n; i++ {
			id := fmt.Sprintf("t-full-%d", i)
			ids = append(ids, id)
			w.produce(event.TaskEvent{
				EventID: "e-" + id, TaskID: id, Attempt: 1, OccurredAt: event.At(time.Now()),
				Source: "unit", Action: "answer_ticket", Stage: event.StageModel, Status: event.StatusOK,
				Output: &event.Output{Text: strings.Repeat("an answer long enough to fill a memtable soon. ", 20), SchemaValid: &valid, Confidence: &conf},
			})
		}
	}
	produce(0, 20)
	full.Store(true)
	// until a's memtable is flushed onto the full disk
	for i := 1; i <= 40; i++ {
		produce(i*20, 20)
		if a.store.Err() != nil {
			break
		}
	}
	select {
	case err := <-done:
		if !errors.Is(err, store.ErrUnwritable) || !errors.Is(err, cause) {
			t.Fatalf("Run returned %v: want the store's failure (ErrUnwritable, %v)", err, cause)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("Run did not return within 60 s of the disk filling (store: %v, %d background errors)", a.store.Err(), a.store.BackgroundErrors())
	}
	if a.Ready() {
		t.Errorf("a says ready after its store failed")
	}
	if !lcWaitFor(60*time.Second, func() bool { return len(b.ownedPartitions()) == 4 && b.Ready() }) {
		t.Fatalf("b owns %v, not every partition, 60 s after a stopped (a had %v)", b.ownedPartitions(), aHad)
	}

	produce(10_000, 40) // on every partition, b's now
	byTask := w.routedByTask(w.topics.Audit, 3*time.Second)
	for _, id := range ids {
		if n := len(byTask[id]); n != 1 {
			t.Errorf("task %s: %d audit records, want 1", id, n)
		}
	}
	if t.Failed() {
		t.Logf("a had partitions %v; %d events", aHad, len(ids))
	}
}

// The lock of the store's write ends its wait when the store fails, and is
// not taken once it failed: neither the run loop nor an assignment
// callback waits for a write that waits for the disk.
func TestAWriteLockGivesUpOnAFailedStore(t *testing.T) {
	var l writeLock
	failed := make(chan struct{})
	if !l.LockUnless(failed) {
		t.Fatal("a free lock was not taken")
	}
	got := make(chan bool, 1)
	go func() { got <- l.LockUnless(failed) }()
	select {
	case <-got:
		t.Fatal("a held lock was taken")
	case <-time.After(50 * time.Millisecond):
	}
	close(failed)
	select {
	case ok := <-got:
		if ok {
			t.Fatal("the lock was taken from its holder")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a wait for the lock did not end when the store failed")
	}
	l.Unlock()
	if l.LockUnless(failed) {
		t.Fatal("a free lock was taken after the store failed: a write could wait for the disk")
	}
}
