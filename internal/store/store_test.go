package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/faultrouter/faultrouter/pkg/task"
)

const hour = int64(3_600_000)

// ingestEveryBulk makes every Bulk of the test ingested as sstables, as a
// large one is, whatever its size (smallBulk).
func ingestEveryBulk(t *testing.T) {
	old := smallBulk
	smallBulk = 0
	t.Cleanup(func() { smallBulk = old })
}

func openTest(t *testing.T) *Store {
	t.Helper()
	s, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// put writes states in one committed batch; old states are what the store held.
func put(t *testing.T, s *Store, p int32, expiresAt int64, sts ...*task.State) {
	t.Helper()
	wb := s.NewBatch()
	for _, st := range sts {
		old, err := s.Get(p, st.TaskID)
		if err != nil {
			t.Fatal(err)
		}
		if err := wb.Put(p, old, st, expiresAt); err != nil {
			t.Fatal(err)
		}
	}
	if err := wb.Commit(); err != nil {
		t.Fatal(err)
	}
}

func expiredIDs(t *testing.T, s *Store, nowMs int64) []string {
	t.Helper()
	var ids []string
	for p := int32(0); p < 4; p++ {
		es, err := s.Expired(p, nowMs, 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range es {
			ids = append(ids, e.TaskID)
		}
	}
	slices.Sort(ids)
	return ids
}

// Guards the TTL contract of the store: a state written with an expiry is
// listed by Expired only once its hour bucket lies wholly in the past, a
// state that never expires (0) is never listed, the stored state carries its
// ExpiresAt (so that the next Put can replace the index entry), and Expired
// names the partition the state was written for.
func TestExpiredListsOnlyExpiredBuckets(t *testing.T) {
	s := openTest(t)
	base := 1000 * hour // an hour boundary
	put(t, s, 2, base+10, &task.State{TaskID: "a"})
	put(t, s, 1, base+hour+10, &task.State{TaskID: "b"})
	put(t, s, 0, 0, &task.State{TaskID: "never"})

	st, err := s.Get(2, "a")
	if err != nil || st == nil {
		t.Fatalf("get a: %v, %v", st, err)
	}
	if st.ExpiresAt != base+10 {
		t.Errorf("stored ExpiresAt = %d, want %d", st.ExpiresAt, base+10)
	}

	for _, c := range []struct {
		name  string
		nowMs int64
		want  []string
	}{
		{"before any expiry", base, nil},
		{"a expired, its bucket not over", base + 20, nil},
		{"a's bucket over", base + hour, []string{"a"}},
		{"b's bucket over", base + 2*hour, []string{"a", "b"}},
		{"much later", base + 1000*hour, []string{"a", "b"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := expiredIDs(t, s, c.nowMs); !slices.Equal(got, c.want) {
				t.Errorf("Expired(%d) = %v, want %v", c.nowMs, got, c.want)
			}
		})
	}
	es, err := s.Expired(2, base+2*hour, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 1 || es[0] != (Due{TaskID: "a", NotBefore: (base + 10) / s.bucketMs}) {
		t.Errorf("Expired(2) with limit 1 = %v, want a in its bucket", es)
	}
	if es, err := s.Expired(1, base+hour, 10); err != nil || len(es) != 0 {
		t.Errorf("Expired(1) before b's bucket is over = %v, %v; want none (a is on partition 2)", es, err)
	}
	if err := s.DropExpired(2, es); err != nil {
		t.Fatal(err)
	}
	if es, err := s.Expired(2, base+2*hour, 10); err != nil || len(es) != 0 {
		t.Errorf("after DropExpired: Expired(2) = %v, %v; want none", es, err)
	}
}

// Guards that index entries follow the state: a new Put moves the expiry and
// due entries (the old ones vanish), and Delete removes the state and every
// index entry, so the sweep never finds a task twice.
func TestPutReplacesAndDeleteRemovesIndexEntries(t *testing.T) {
	s := openTest(t)
	base := 2000 * hour
	put(t, s, 3, base+5, &task.State{TaskID: "t", Pending: &task.PendingRetry{N: 1, NotBefore: base + 1}})

	// the task gets a new event: its expiry moves two hours on, its retry is gone
	put(t, s, 3, base+2*hour+5, &task.State{TaskID: "t"})
	if got := expiredIDs(t, s, base+hour); len(got) != 0 {
		t.Errorf("after re-Put, the old expiry entry is still listed: %v", got)
	}
	if ids, err := s.Due(3, base+hour, 10); err != nil || len(ids) != 0 {
		t.Errorf("after re-Put without a pending retry, Due = %v, %v; want none", ids, err)
	}
	if got := expiredIDs(t, s, base+3*hour); !slices.Equal(got, []string{"t"}) {
		t.Errorf("Expired after the new bucket = %v, want [t]", got)
	}

	old, err := s.Get(3, "t")
	if err != nil {
		t.Fatal(err)
	}
	wb := s.NewBatch()
	if err := wb.Delete(3, old); err != nil {
		t.Fatal(err)
	}
	if err := wb.Commit(); err != nil {
		t.Fatal(err)
	}
	if st, err := s.Get(3, "t"); err != nil || st != nil {
		t.Errorf("after Delete, Get = %v, %v; want nil", st, err)
	}
	if got := expiredIDs(t, s, base+1000*hour); len(got) != 0 {
		t.Errorf("after Delete, Expired still lists %v", got)
	}
}

// Guards the due index: Due lists the pending retries of one partition whose
// not-before time has come, earliest first, up to the limit, and never those
// of another partition or those not yet due.
func TestDueIndex(t *testing.T) {
	s := openTest(t)
	pending := func(id string, notBefore int64) *task.State {
		return &task.State{TaskID: id, Pending: &task.PendingRetry{N: 1, NotBefore: notBefore}}
	}
	put(t, s, 0, 0, pending("late", 300), pending("early", 100), pending("mid", 200), pending("future", 10_000))
	put(t, s, 1, 0, pending("other-partition", 50))

	for _, c := range []struct {
		name  string
		p     int32
		now   int64
		limit int
		want  []string
	}{
		{"nothing due yet", 0, 99, 10, nil},
		{"exactly due", 0, 100, 10, []string{"early"}},
		{"earliest first", 0, 300, 10, []string{"early", "mid", "late"}},
		{"limit", 0, 300, 2, []string{"early", "mid"}},
		{"other partition", 1, 300, 10, []string{"other-partition"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			due, err := s.Due(c.p, c.now, c.limit)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, d := range due {
				got = append(got, d.TaskID)
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("Due(%d, %d, %d) = %v, want %v", c.p, c.now, c.limit, got, c.want)
			}
		})
	}
}

// Guards the order of held retries in the due index: retries a breaker held
// and moved to the same not-before time come out in the order they were due
// (not by task ID), before a retry due later that was never held; a retry's
// entry moves with its state, and DropDue drops exactly the entry it read.
func TestDueIndexOrdersHeldRetriesByTheirDueTime(t *testing.T) {
	s := openTest(t)
	held := func(id string, notBefore, dueAt int64) *task.State {
		return &task.State{TaskID: id, Pending: &task.PendingRetry{N: 1, NotBefore: notBefore, DueAt: dueAt}}
	}
	put(t, s, 0, 0, held("a-due-third", 5000, 300), held("z-due-first", 5000, 100), held("m-due-second", 5000, 200),
		&task.State{TaskID: "b-due-later", Pending: &task.PendingRetry{N: 1, NotBefore: 5001}})
	ids := func(now int64) []string {
		due, err := s.Due(0, now, 10)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, d := range due {
			got = append(got, d.TaskID)
		}
		return got
	}
	if got, want := ids(5001), []string{"z-due-first", "m-due-second", "a-due-third", "b-due-later"}; !slices.Equal(got, want) {
		t.Fatalf("Due = %v, want %v", got, want)
	}
	// held again, later: the old entry goes
	old := held("z-due-first", 5000, 100)
	b := s.NewBatch()
	if err := b.Put(0, old, held("z-due-first", 9000, 100), 0); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if got, want := ids(5001), []string{"m-due-second", "a-due-third", "b-due-later"}; !slices.Equal(got, want) {
		t.Fatalf("after moving z: Due = %v, want %v", got, want)
	}
	due, err := s.Due(0, 5000, 1)
	if err != nil || len(due) != 1 || due[0] != (Due{TaskID: "m-due-second", NotBefore: 5000, DueAt: 200}) {
		t.Fatalf("Due = %v, %v; want m-due-second@5000 due 200", due, err)
	}
	if err := s.DropDue(0, due); err != nil {
		t.Fatal(err)
	}
	if got, want := ids(9000), []string{"a-due-third", "b-due-later", "z-due-first"}; !slices.Equal(got, want) {
		t.Fatalf("after DropDue(m): Due = %v, want %v", got, want)
	}
}

// Guards the due index's repair: an entry whose task no longer has that
// pending retry is dropped, and the others stay.
func TestDropDue(t *testing.T) {
	s := openTest(t)
	st := &task.State{TaskID: "a", Pending: &task.PendingRetry{N: 1, NotBefore: 100}}
	put(t, s, 0, 0, st, &task.State{TaskID: "b", Pending: &task.PendingRetry{N: 1, NotBefore: 200}})
	due, err := s.Due(0, 1000, 10)
	if err != nil || len(due) != 2 || due[0] != (Due{TaskID: "a", NotBefore: 100, DueAt: 100}) {
		t.Fatalf("Due = %v, %v; want a@100 and b@200", due, err)
	}
	if err := s.DropDue(0, due[:1]); err != nil {
		t.Fatal(err)
	}
	due, err = s.Due(0, 1000, 10)
	if err != nil || len(due) != 1 || due[0].TaskID != "b" {
		t.Fatalf("after DropDue(a): Due = %v, %v; want only b", due, err)
	}
}

// Guards the overdue-review index: an open item is listed once its owner's
// deadline passes, and leaves the index once alerted or closed.
func TestOverdueIndex(t *testing.T) {
	s := openTest(t)
	open := &task.State{TaskID: "r", Review: task.ReviewOpen, ReviewDueAt: 500}
	put(t, s, 2, 0, open)
	if due, err := s.Overdue(2, 499, 10); err != nil || len(due) != 0 {
		t.Fatalf("before the deadline: Overdue = %v, %v; want none", due, err)
	}
	if due, err := s.Overdue(2, 500, 10); err != nil || len(due) != 1 || due[0] != (Due{TaskID: "r", NotBefore: 500}) {
		t.Fatalf("at the deadline: Overdue = %v, %v; want r@500", due, err)
	}
	alerted := *open
	alerted.ReviewAlerted = true
	wb := s.NewBatch()
	if err := wb.Put(2, open, &alerted, 0); err != nil {
		t.Fatal(err)
	}
	if err := wb.Commit(); err != nil {
		t.Fatal(err)
	}
	if due, err := s.Overdue(2, 1000, 10); err != nil || len(due) != 0 {
		t.Fatalf("after the alert: Overdue = %v, %v; want none", due, err)
	}
}

// Guards the restore checkpoint: unknown before the first write, then the
// offset written, per partition.
func TestCheckpoint(t *testing.T) {
	s := openTest(t)
	if _, ok, err := s.Checkpoint(4); err != nil || ok {
		t.Fatalf("fresh store: Checkpoint = ok %v, err %v; want unknown", ok, err)
	}
	wb := s.NewBatch()
	if err := wb.SetCheckpoint(4, 1234); err != nil {
		t.Fatal(err)
	}
	if err := wb.Commit(); err != nil {
		t.Fatal(err)
	}
	next, ok, err := s.Checkpoint(4)
	if err != nil || !ok || next != 1234 {
		t.Errorf("Checkpoint(4) = %d, %v, %v; want 1234, true", next, ok, err)
	}
	if _, ok, _ := s.Checkpoint(5); ok {
		t.Errorf("Checkpoint(5) is known, want unknown")
	}
}

// Guards WipePartition: it drops every task of the partition with its index
// entries, checkpoint and release mark, and nothing of another partition,
// not even a task that moved from the wiped partition to another one.
func TestWipePartitionDropsOnlyItsTasks(t *testing.T) {
	s := openTest(t)
	b := s.NewBatch()
	put := func(p int32, old *task.State, id string) *task.State {
		st := &task.State{TaskID: id, Pending: &task.PendingRetry{N: 1, NotBefore: 1000}}
		if err := b.Put(p, old, st, 5000); err != nil {
			t.Fatal(err)
		}
		return st
	}
	put(1, nil, "a")
	moved := put(1, nil, "moved")
	put(2, nil, "b")
	if err := b.SetCheckpoint(1, 7); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	b = s.NewBatch()
	put(2, moved, "moved") // the task's state now lives in partition 2
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := s.SetReleased(1, Release{End: 9, At: time.Now()}); err != nil {
		t.Fatal(err)
	}

	had, err := s.WipePartition(1)
	if err != nil || !had {
		t.Fatalf("WipePartition(1) = %v, %v; want tasks dropped", had, err)
	}
	for id, want := range map[string]bool{"a": false, "moved": true, "b": true} {
		st, err := s.Get(2, id)
		if id == "a" {
			st, err = s.Get(1, id)
		}
		if err != nil || (st != nil) != want {
			t.Errorf("task %s after the wipe: %+v, %v; want present %v", id, st, err, want)
		}
	}
	if due, _ := s.Due(1, 10_000, 10); len(due) != 0 {
		t.Errorf("due index of partition 1 after the wipe: %v", due)
	}
	if due, _ := s.Due(2, 10_000, 10); len(due) != 2 {
		t.Errorf("due index of partition 2: %v, want b and moved", due)
	}
	if _, ok, _ := s.Checkpoint(1); ok {
		t.Errorf("checkpoint of partition 1 survived the wipe")
	}
	if _, ok, _ := s.TakeReleased(1); ok {
		t.Errorf("release mark of partition 1 survived the wipe")
	}
}

// TestReadsStatesOfEarlierBuilds guards an upgrade in place: a state
// directory written by a build that stored states as JSON is read as it is
// (states are Avro TaskState records now, told apart by their first byte),
// and a state written afresh replaces it with its index entries.
func TestReadsStatesOfEarlierBuilds(t *testing.T) {
	s := openTest(t)
	old := &task.State{TaskID: "t-json", Attempts: 2, Review: task.ReviewOpen, ReviewDueAt: 5000,
		Pending: &task.PendingRetry{N: 1, DelayMs: 1000, NotBefore: 2000}, ExpiresAt: 9_000_000}
	v, err := old.Marshal() // the JSON form earlier builds wrote
	if err != nil {
		t.Fatal(err)
	}
	if v[0] != '{' {
		t.Fatalf("JSON state starts with %q", v[0])
	}
	b := s.NewBatch()
	if err := b.PutEncoded(3, nil, old, v); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(3, "t-json")
	if err != nil {
		t.Fatal(err)
	}
	if got == nil || got.Attempts != 2 || got.Pending == nil || got.Pending.NotBefore != 2000 || got.Review != task.ReviewOpen {
		t.Fatalf("JSON state read as %+v", got)
	}
	due, err := s.Due(3, 3000, 10)
	if err != nil || len(due) != 1 {
		t.Fatalf("due index of the JSON state: %v, %v", due, err)
	}
	// the next write is Avro and moves the index entries
	got.Pending = nil
	b = s.NewBatch()
	if err := b.Put(3, old, got, 9_000_000); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	raw, closer, err := s.db.Get(taskKey(3, "t-json"))
	if err != nil {
		t.Fatal(err)
	}
	if raw[0] != 0xC3 || raw[1] != 0x01 {
		t.Errorf("rewritten state starts with % x, want the Avro single-object marker", raw[:2])
	}
	closer.Close()
	if due, _ := s.Due(3, 3000, 10); len(due) != 0 {
		t.Errorf("due index still lists %v", due)
	}
	again, err := s.Get(3, "t-json")
	if err != nil || again.Attempts != 2 || again.Pending != nil {
		t.Fatalf("Avro state read as %+v, %v", again, err)
	}
}

// Guards the restore of a corrupted store: a checkpoint that is not an 8-byte
// offset (a torn or foreign write) is ErrCorruptCheckpoint, which the router
// answers by restoring the partition from the changelog's start instead of
// failing every restore of it.
func TestCheckpointCorrupt(t *testing.T) {
	s := openTest(t)
	if err := s.db.Set(checkpointKey(3), []byte{0xde, 0xad, 0xbe}, pebble.NoSync); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Checkpoint(3); !errors.Is(err, ErrCorruptCheckpoint) {
		t.Fatalf("Checkpoint of a 3-byte checkpoint = %v, want ErrCorruptCheckpoint", err)
	}
	wb := s.NewBatch()
	if err := wb.SetCheckpoint(3, 77); err != nil {
		t.Fatal(err)
	}
	if err := wb.Commit(); err != nil {
		t.Fatal(err)
	}
	if next, ok, err := s.Checkpoint(3); err != nil || !ok || next != 77 {
		t.Errorf("after a restore wrote it again: Checkpoint = %d, %v, %v; want 77, true", next, ok, err)
	}
}

// Guards Bulk, the restore's writer: its writes are applied at once, the
// last write of a key wins (a delete after a put, a put after a delete),
// writes replace what the store held, and they survive a reopen.
func TestBulkAppliesLastWritePerKey(t *testing.T) {
	t.Run("batch", func(t *testing.T) { testBulkAppliesLastWritePerKey(t) })
	t.Run("ingested", func(t *testing.T) { ingestEveryBulk(t); testBulkAppliesLastWritePerKey(t) })
}

func testBulkAppliesLastWritePerKey(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	put(t, s, 0, 5*hour, &task.State{TaskID: "held", Attempts: 1, Pending: &task.PendingRetry{N: 1, NotBefore: 100}})
	enc := func(st *task.State) []byte {
		v, err := s.codec.EncodeState(nil, st)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	old, err := s.Get(0, "held")
	if err != nil || old == nil {
		t.Fatalf("held: %v %v", old, err)
	}
	b := s.NewBulk(0)
	fresh := &task.State{TaskID: "fresh", Attempts: 1, Pending: &task.PendingRetry{N: 1, NotBefore: 200}}
	held := &task.State{TaskID: "held", Attempts: 2, ExpiresAt: 7 * hour}
	again := &task.State{TaskID: "again", Attempts: 3}
	for _, err := range []error{
		b.PutEncoded(0, nil, fresh, enc(fresh)),
		b.PutEncoded(0, old, held, enc(held)),
		b.PutEncoded(0, nil, &task.State{TaskID: "deleted", Attempts: 1}, enc(&task.State{TaskID: "deleted", Attempts: 1})),
		b.DeleteTask(0, &task.State{TaskID: "deleted"}),
		b.DeleteTask(0, &task.State{TaskID: "again"}),
		b.PutEncoded(0, nil, again, enc(again)),
		b.SetCheckpoint(0, 42),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if st, _ := s.Get(0, "fresh"); st != nil {
		t.Fatalf("a bulk write is visible before its commit: %+v", st)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(dir, nil); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for id, want := range map[string]int32{"fresh": 1, "held": 2, "again": 3, "deleted": 0} {
		st, err := s.Get(0, id)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case want == 0 && st != nil:
			t.Errorf("%s: %+v, want deleted", id, st)
		case want != 0 && (st == nil || st.Attempts != want):
			t.Errorf("%s: %+v, want attempts %d", id, st, want)
		}
	}
	due, err := s.Due(0, 1000, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(due) != 1 || due[0].TaskID != "fresh" {
		t.Errorf("due index %+v, want only fresh (held's entry replaced)", due)
	}
	if next, ok, err := s.Checkpoint(0); err != nil || !ok || next != 42 {
		t.Errorf("checkpoint %d %v %v, want 42", next, ok, err)
	}
	if had, err := s.WipePartition(0); err != nil || !had {
		t.Errorf("wipe found no tasks (%v), want 3", err)
	}
	for _, id := range []string{"fresh", "held", "again"} {
		if st, err := s.Get(0, id); err != nil || st != nil {
			t.Errorf("%s after the wipe: %+v (%v)", id, st, err)
		}
	}
}

// Guards the batched read of a poll: Load returns, for every known task of a
// poll, the state Get returns, whether it sits in the memtable or in an
// sstable, deleted tasks and unknown tasks are left out, a task asked for twice
// is read once, and a state the caller already holds is not overwritten.
func TestLoadReadsWhatGetReads(t *testing.T) {
	s := openTest(t)
	var flushed, fresh []*task.State
	for i := range 300 {
		st := &task.State{TaskID: fmt.Sprintf("task-%03d", i), Attempts: int32(i + 1)}
		if i < 150 {
			flushed = append(flushed, st)
		} else {
			fresh = append(fresh, st)
		}
	}
	put(t, s, 0, 0, flushed...)
	if err := s.db.Flush(); err != nil { // the first half is read from an sstable
		t.Fatal(err)
	}
	put(t, s, 1, 0, fresh...)
	wb := s.NewBatch()
	if err := wb.Delete(0, flushed[7]); err != nil {
		t.Fatal(err)
	}
	if err := wb.Commit(); err != nil {
		t.Fatal(err)
	}

	// unsorted, with duplicates, unknown tasks and a deleted one
	ids := []string{"task-299", "nope-1", "task-007", "task-150", "task-000", "task-299", "task-149", "zzz", "task-042", "a"}
	held := &task.State{TaskID: "task-042", Attempts: 99}
	out := map[string]*task.State{"task-042": held}
	partOf := func(id string) int32 {
		if id < "task-150" {
			return 0
		}
		return 1
	}
	if err := s.Load(ids, partOf, out); err != nil {
		t.Fatal(err)
	}
	want := []string{"task-000", "task-042", "task-149", "task-150", "task-299"}
	if got := slices.Sorted(maps.Keys(out)); !slices.Equal(got, want) {
		t.Fatalf("Load read tasks %v, want %v", got, want)
	}
	if out["task-042"] != held {
		t.Errorf("Load replaced a state the caller held")
	}
	for _, id := range []string{"task-000", "task-149", "task-150", "task-299"} {
		st, err := s.Get(partOf(id), id)
		if err != nil {
			t.Fatal(err)
		}
		if out[id].TaskID != id || out[id].Attempts != st.Attempts {
			t.Errorf("Load(%s) = %+v, Get = %+v", id, out[id], st)
		}
	}
	if err := s.Load(nil, partOf, out); err != nil {
		t.Errorf("Load of no tasks: %v", err)
	}
}

// Guards a large Bulk, written as several sstables over consecutive key
// ranges and ingested at once: every task lands with its index entries.
func TestBulkOfManyTasks(t *testing.T) {
	s := openTest(t)
	const n = 30_000
	b := s.NewBulk(8 * n)
	for i := range n {
		st := &task.State{TaskID: fmt.Sprintf("task-%05d", i), Attempts: int32(i%7 + 1), Pending: &task.PendingRetry{N: 1, NotBefore: int64(i)}}
		v, err := s.codec.EncodeState(nil, st)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.PutEncoded(int32(i%3), nil, st, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 1, n / 2, n - 1} {
		st, err := s.Get(int32(i%3), fmt.Sprintf("task-%05d", i))
		if err != nil || st == nil || st.Attempts != int32(i%7+1) {
			t.Errorf("task %d: %+v %v", i, st, err)
		}
	}
	total := 0
	for p := range int32(3) {
		due, err := s.Due(p, n, 2*n)
		if err != nil {
			t.Fatal(err)
		}
		total += len(due)
		if had, err := s.WipePartition(p); err != nil || !had {
			t.Errorf("partition %d: wipe found no tasks (%v), want %d", p, err, len(due))
		}
		if due, err := s.Due(p, n, 2*n); err != nil || len(due) != 0 {
			t.Errorf("partition %d: %d due after the wipe (%v)", p, len(due), err)
		}
	}
	if total != n {
		t.Errorf("due index holds %d tasks, want %d", total, n)
	}
}

// Guards "a scan of a time index finds every entry that has come due" once
// scans start past the deleted entries before the first live one: after a
// scan found the index empty up to now (its entries moved later), an entry
// written before that point, by a Batch or by a Bulk (a restore), is still
// found, in order.
func TestScanFindsEntriesWrittenBeforeAnEarlierScan(t *testing.T) {
	s := openTest(t)
	pending := func(id string, notBefore int64) *task.State {
		return &task.State{TaskID: id, Pending: &task.PendingRetry{N: 1, NotBefore: notBefore}}
	}
	ids := func(due []Due) []string {
		var out []string
		for _, d := range due {
			out = append(out, d.TaskID)
		}
		return out
	}
	scan := func(now int64) []string {
		t.Helper()
		due, err := s.Scan(DueIndex, 0, now, 10)
		if err != nil {
			t.Fatal(err)
		}
		return ids(due)
	}
	put(t, s, 0, 0, pending("a", 100), pending("b", 200))
	if got := scan(1000); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("first scan: %v, want [a b]", got)
	}
	// both move past now (held): the scan finds nothing up to now
	put(t, s, 0, 0, pending("a", 5000), pending("b", 5000))
	if got := scan(1000); got != nil {
		t.Fatalf("after the move: %v, want nothing due", got)
	}
	// a batch writes an entry before the time that scan reached
	put(t, s, 0, 0, pending("c", 50))
	if got := scan(1000); !slices.Equal(got, []string{"c"}) {
		t.Fatalf("after a batch wrote c at 50: %v, want [c]", got)
	}
	put(t, s, 0, 0, pending("c", 6000))
	if got := scan(1000); got != nil {
		t.Fatalf("after c moved: %v, want nothing due", got)
	}
	// a bulk (a restore) writes one too
	bk := s.NewBulk(8)
	if err := bk.PutEncoded(0, nil, pending("d", 70), mustEncode(t, s, pending("d", 70))); err != nil {
		t.Fatal(err)
	}
	if err := bk.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := scan(1000); !slices.Equal(got, []string{"d"}) {
		t.Fatalf("after a bulk wrote d at 70: %v, want [d]", got)
	}
	if got := scan(6000); !slices.Equal(got, []string{"d", "a", "b", "c"}) {
		t.Fatalf("everything due: %v, want [d a b c]", got)
	}
}

func mustEncode(t *testing.T, s *Store, st *task.State) []byte {
	t.Helper()
	v, err := s.codec.EncodeState(nil, st)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// Guards what makes a restore from an empty state directory cheap: a new
// store, its partitions wiped, then restored one Bulk per group of whole
// partitions, holds every table in Pebble's last level, and nothing was
// flushed or compacted. A range delete of an empty store, or a table that
// spans two partitions, puts later tables above the earlier ones for
// Pebble to compact.
func TestBulksOfWholePartitionsLandInTheLastLevel(t *testing.T) {
	ingestEveryBulk(t)
	s := openTest(t)
	for p := range int32(4) {
		if had, err := s.WipePartition(p); err != nil || had {
			t.Fatalf("wipe of partition %d of a new store: %v, %v", p, had, err)
		}
	}
	for _, group := range [][]int32{{0, 1}, {2}, {3}} {
		b := s.NewBulk(0)
		for _, p := range group {
			for i := range 2000 {
				st := &task.State{TaskID: fmt.Sprintf("task-%05d", i), Attempts: 1, ExpiresAt: int64(i) * hour,
					Pending: &task.PendingRetry{N: 1, NotBefore: int64(i)}, Review: task.ReviewOpen, ReviewDueAt: int64(i)}
				if err := b.PutEncoded(p, nil, st, mustEncode(t, s, st)); err != nil {
					t.Fatal(err)
				}
			}
			if err := b.SetCheckpoint(p, 2000); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	m := s.db.Metrics()
	for l := range 6 {
		if n := m.Levels[l].TablesCount; n != 0 {
			t.Errorf("level %d holds %d tables, want every table in the last level", l, n)
		}
	}
	if m.Levels[6].TablesCount == 0 {
		t.Errorf("no table in the last level")
	}
	if m.Compact.Count != 0 || m.Flush.Count != 0 {
		t.Errorf("%d compactions and %d flushes, want none", m.Compact.Count, m.Flush.Count)
	}
	for p := range int32(4) {
		if st, err := s.Get(p, "task-01999"); err != nil || st == nil {
			t.Errorf("partition %d: task-01999 is %+v (%v)", p, st, err)
		}
	}
}

// Guards the upgrade of a state directory of an earlier key layout: it is
// emptied on open (the restore then fills it from the changelog), so that
// keys of the old layout cannot be read as the new one's, and it is
// marked with the current layout.
func TestOpenEmptiesAStoreOfAnotherLayout(t *testing.T) {
	dir := t.TempDir()
	db, err := pebble.Open(dir, &pebble.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"v": "3", "t/old-task": "{}", "r/old-task": "\x00\x00\x00\x01", "c/\x00\x00\x00\x01": "\x00\x00\x00\x00\x00\x00\x00\x09"} {
		if err := db.Set([]byte(k), []byte(v), pebble.Sync); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	s, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	it, err := s.db.NewIter(nil)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for ok := it.First(); ok; ok = it.Next() {
		keys = append(keys, string(it.Key())+"="+string(it.Value()))
	}
	it.Close()
	if want := []string{"v=" + layoutVersion}; !slices.Equal(keys, want) {
		t.Errorf("store after open: %q, want only %q", keys, want)
	}
	if _, ok, err := s.Checkpoint(1); err != nil || ok {
		t.Errorf("checkpoint of the old layout kept: %v, %v", ok, err)
	}
}

// Guards EntriesOf, what a restore reads of a task stored before its
// window: the index entries of the stored state, as EntriesOf of the state
// Get returns, and none for a task the store does not hold in that
// partition.
func TestEntriesOfReadsTheStoredState(t *testing.T) {
	s := openTest(t)
	st := &task.State{TaskID: "t", Attempts: 1, Pending: &task.PendingRetry{N: 1, DelayMs: 10, NotBefore: 500},
		Review: task.ReviewOpen, ReviewDueAt: 900}
	put(t, s, 2, 7*hour, st)
	got, ok, err := s.EntriesOf(2, []byte("t"))
	stored, gerr := s.Get(2, "t")
	if err != nil || gerr != nil || !ok || stored == nil {
		t.Fatalf("EntriesOf = %+v, %v, %v; Get = %+v, %v", got, ok, err, stored, gerr)
	}
	if want := EntriesOf(stored); got != want || !got.Pending || got.OverdueAt != 900 || got.ExpiresAt != 7*hour {
		t.Errorf("EntriesOf = %+v, want %+v", got, want)
	}
	for _, p := range []int32{0, 3} {
		if got, ok, err := s.EntriesOf(p, []byte("t")); err != nil || ok {
			t.Errorf("partition %d: EntriesOf = %+v, %v, %v; want none", p, got, ok, err)
		}
	}
}

// Guards the small Bulk, a partition handed over in a rebalance: it is
// written as one batch, not ingested (no sstable, no mark to sync, no
// flush of the memtable it overlaps after a wipe), and reads back whole.
func TestASmallBulkIsWrittenAsABatch(t *testing.T) {
	s := openTest(t)
	put(t, s, 1, 5*hour, &task.State{TaskID: "task-00000", Attempts: 9})
	if _, err := s.WipePartition(1); err != nil {
		t.Fatal(err)
	}
	const n = 2000
	b := s.NewBulk(0)
	for i := range n {
		st := &task.State{TaskID: fmt.Sprintf("task-%05d", i), Attempts: 1, Pending: &task.PendingRetry{N: 1, NotBefore: int64(i)}}
		if err := b.PutEncoded(1, nil, st, mustEncode(t, s, st)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.SetCheckpoint(1, n); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if m := s.db.Metrics(); m.Ingest.Count != 0 || m.Flush.Count != 0 {
		t.Errorf("%d ingestions and %d flushes, want none", m.Ingest.Count, m.Flush.Count)
	}
	if _, err := os.Stat(filepath.Join(s.dir, unsyncedMark)); !os.IsNotExist(err) {
		t.Errorf("the unsynced mark is there (%v): a batch needs none", err)
	}
	due, err := s.Due(1, n, 2*n)
	if err != nil || len(due) != n {
		t.Fatalf("%d due (%v), want %d", len(due), err, n)
	}
	if st, err := s.Get(1, "task-00000"); err != nil || st == nil || st.Attempts != 1 {
		t.Errorf("task-00000 is %+v (%v), want the Bulk's state", st, err)
	}
	if next, ok, err := s.Checkpoint(1); err != nil || !ok || next != n {
		t.Errorf("checkpoint %d %v %v, want %d", next, ok, err, n)
	}
}

// Guards the reuse of a committed Bulk's memory (its write list, key arena
// and file buffers) by the next one, as a restore builds a window while the
// one before it is written: every task of both Bulks reads back as written.
func TestBulksReuseMemoryOnlyOnceWritten(t *testing.T) {
	ingestEveryBulk(t)
	s := openTest(t)
	const n = 20_000
	fill := func(b *Bulk, p int32, attempts int32) {
		for i := range n {
			st := &task.State{TaskID: fmt.Sprintf("task-%05d", i), Attempts: attempts, ExpiresAt: int64(i+1) * hour,
				Pending: &task.PendingRetry{N: 1, NotBefore: int64(i)}}
			if err := b.PutEncoded(p, nil, st, mustEncode(t, s, st)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for round := range int32(3) {
		a := s.NewBulk(0)
		fill(a, 2*round, 1)
		done := make(chan error)
		go func() { done <- a.Commit() }()
		b := s.NewBulk(0) // built while a is written
		fill(b, 2*round+1, 2)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if err := b.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	for p := range int32(6) {
		want := int32(p%2 + 1)
		for _, i := range []int{0, n / 3, n - 1} {
			id := fmt.Sprintf("task-%05d", i)
			if st, err := s.Get(p, id); err != nil || st == nil || st.Attempts != want || st.TaskID != id {
				t.Fatalf("partition %d, %s: %+v (%v), want attempts %d", p, id, st, err, want)
			}
		}
		due, err := s.Due(p, n, 2*n)
		if err != nil || len(due) != n {
			t.Fatalf("partition %d: %d due (%v), want %d", p, len(due), err, n)
		}
		for i, d := range due {
			if want := fmt.Sprintf("task-%05d", i); d.TaskID != want || d.NotBefore != int64(i) {
				t.Fatalf("partition %d: due entry %d is %+v, want %s at %d", p, i, d, want, i)
			}
		}
	}
}

// Guards the expiry bucket's width: with a bucket of one second a task is
// listed as expired once the second holding its expiry is over (what a
// time-compressed policy needs), and the width is part of the key layout:
// the same directory opened with the default width is emptied (its expiry
// keys would be read in the wrong unit) and restored from the changelog.
func TestExpiryBucketWidth(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenWith(dir, nil, Options{ExpiryBucket: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	base := int64(1_700_000_000_000)
	b := s.NewBatch()
	if err := b.Put(0, nil, &task.State{TaskID: "short", Attempts: 1}, base+1_500); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if es, err := s.Expired(0, base+1_900, 10); err != nil || len(es) != 0 {
		t.Errorf("Expired within the expiry's second = %v, %v; want none", es, err)
	}
	if es, err := s.Expired(0, base+2_000, 10); err != nil || len(es) != 1 || es[0].TaskID != "short" {
		t.Errorf("Expired once the expiry's second is over = %v, %v; want short", es, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if st, err := s.Get(0, "short"); err != nil || st != nil {
		t.Errorf("a store of another expiry bucket opened with the default: task %+v (%v), want it emptied", st, err)
	}
}

// Guards the store without a write-ahead log: what a killed process leaves
// on disk is the store as of its last memtable flush, whole batches of it,
// its release marks and checkpoints with them, and a clean Close keeps
// everything. The copy of the directory taken while the store is open is
// what a SIGKILL leaves (the files a process wrote outlive it).
func TestAKilledStoreComesBackAsItsLastFlush(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	setCheckpoint := func(p int32, next int64) {
		b := s.NewBatch()
		if err := b.SetCheckpoint(p, next); err != nil {
			t.Fatal(err)
		}
		if err := b.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	// flushed: task a, changelog applied to 10, partition released at 10
	put(t, s, 0, 0, &task.State{TaskID: "a", Attempts: 1})
	setCheckpoint(0, 10)
	if err := s.SetReleased(0, Release{End: 10, At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := s.db.Flush(); err != nil {
		t.Fatal(err)
	}
	// not flushed: the partition taken back, task b, applied to 20
	if r, ok, err := s.TakeReleased(0); err != nil || !ok || r.End != 10 {
		t.Fatalf("release mark: %d, %v, %v; want 10", r.End, ok, err)
	}
	put(t, s, 0, 0, &task.State{TaskID: "b", Attempts: 1}, &task.State{TaskID: "a", Attempts: 2})
	setCheckpoint(0, 20)

	killed := t.TempDir()
	if err := os.CopyFS(killed, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	k, err := Open(killed, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	if a, err := k.Get(0, "a"); err != nil || a == nil || a.Attempts != 1 {
		t.Fatalf("killed store: task a %+v, %v; want its flushed state, attempt 1", a, err)
	}
	if b, err := k.Get(0, "b"); err != nil || b != nil {
		t.Fatalf("killed store: task b %+v, %v; want none (never flushed)", b, err)
	}
	if next, ok, err := k.Checkpoint(0); err != nil || !ok || next != 10 {
		t.Fatalf("killed store: checkpoint %d, %v, %v; want 10, with the states it covers", next, ok, err)
	}
	// the mark it comes back with is the flushed one, with the state and
	// checkpoint it was written after: the changelog has moved past it (to
	// 20), so the restore applies it from the checkpoint 10 if the mark is
	// recent enough, or wipes the partition (package restore)
	if r, ok, err := k.TakeReleased(0); err != nil || !ok || r.End != 10 || r.At.IsZero() {
		t.Fatalf("killed store: release mark %d at %v, %v, %v; want the flushed 10, with its time", r.End, r.At, ok, err)
	}

	c, err := Open(dir, nil) // closed cleanly: everything kept
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if b, err := c.Get(0, "b"); err != nil || b == nil {
		t.Fatalf("closed store: task b %+v, %v; want it", b, err)
	}
	if next, _, err := c.Checkpoint(0); err != nil || next != 20 {
		t.Fatalf("closed store: checkpoint %d, %v; want 20", next, err)
	}
	if _, ok, err := c.TakeReleased(0); err != nil || ok {
		t.Fatalf("closed store: a release mark (%v, %v); want none, it was taken", ok, err)
	}
}

// Guards the release mark's two forms: a mark holds its changelog offset,
// the time it was written (to the millisecond) and the partition's
// checkpoint then; a mark an earlier release wrote, the offset alone, reads
// with no time (the restore then does not catch the partition up from it).
func TestReleaseMarkKeepsItsTime(t *testing.T) {
	s := openTest(t)
	at := time.UnixMilli(1_800_000_000_123)
	if err := s.SetReleased(3, Release{End: 77, At: at, Checkpoint: 75}); err != nil {
		t.Fatal(err)
	}
	if r, ok, err := s.TakeReleased(3); err != nil || !ok || r.End != 77 || !r.At.Equal(at) || r.Checkpoint != 75 {
		t.Errorf("mark %+v, %v, %v; want 77 at %v, checkpoint 75", r, ok, err, at)
	}
	if _, ok, err := s.TakeReleased(3); err != nil || ok {
		t.Errorf("a taken mark read again: %v, %v", ok, err)
	}
	if err := s.db.Set(releasedKey(4), binary.BigEndian.AppendUint64(nil, 55), pebble.NoSync); err != nil {
		t.Fatal(err)
	}
	if r, ok, err := s.TakeReleased(4); err != nil || !ok || r.End != 55 || !r.At.IsZero() || r.Checkpoint != -1 {
		t.Errorf("an earlier release's mark: %+v, %v, %v; want 55 with no time or checkpoint", r, ok, err)
	}
}

// A state written again with index entries of the same keys (its expiry in
// the same bucket, its retry due at the same time) writes them, and deletes
// nothing first: three writes, not five. One that moved writes the new
// keys and deletes the old: each index holds the task once, at its key.
func TestRewriteDeletesOnlyTheIndexEntriesThatMoved(t *testing.T) {
	s := openTest(t)
	st := &task.State{TaskID: "t1", Pending: &task.PendingRetry{N: 1, NotBefore: 1000}}
	put(t, s, 0, 3_600_100, st)

	old, err := s.Get(0, "t1")
	if err != nil || old == nil {
		t.Fatalf("Get: %v, %v", old, err)
	}
	again := &task.State{TaskID: "t1", Attempts: 2, Pending: &task.PendingRetry{N: 1, NotBefore: 1000}}
	b := s.NewBatch()
	if err := b.Put(0, old, again, 3_600_200); err != nil { // the same hour bucket
		t.Fatal(err)
	}
	if n := b.Len(); n != 3 {
		t.Errorf("a rewrite with the same index keys: %d writes in the batch, want 3 (the state, its due and expiry entries)", n)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if due, _ := s.Due(0, 10_000, 10); len(due) != 1 || due[0].TaskID != "t1" {
		t.Errorf("due index after the rewrite: %v, want t1 once", due)
	}
	if got := expiredIDs(t, s, 1<<50); !slices.Equal(got, []string{"t1"}) {
		t.Errorf("expiry index after the rewrite: %v, want t1 once", got)
	}

	old, _ = s.Get(0, "t1")
	moved := &task.State{TaskID: "t1", Attempts: 3, Pending: &task.PendingRetry{N: 2, NotBefore: 2000}}
	b = s.NewBatch()
	if err := b.Put(0, old, moved, 3*3_600_000+5); err != nil { // two buckets later
		t.Fatal(err)
	}
	if n := b.Len(); n != 5 {
		t.Errorf("a rewrite with new index keys: %d writes, want 5 (two deletions, three writes)", n)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if due, _ := s.Due(0, 10_000, 10); len(due) != 1 || due[0].NotBefore != 2000 {
		t.Errorf("due index after the move: %v, want t1 once, at 2000", due)
	}
	if got := expiredIDs(t, s, 3_600_000*2); len(got) != 0 {
		t.Errorf("expiry index after the move: %v expired two buckets early; want none", got)
	}
	if got := expiredIDs(t, s, 1<<50); !slices.Equal(got, []string{"t1"}) {
		t.Errorf("expiry index after the move: %v, want t1 once", got)
	}
}
