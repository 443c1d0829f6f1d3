package store

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/faultrouter/faultrouter/pkg/task"
)

// Guards the store after a machine stop in the middle of a restore: a Bulk's
// sstables are linked into the store before they are synced, so a store left
// while they were being synced (the unsynced mark there) may hold files that
// never reached the disk. Open empties it, for the restore to fill it again
// from the changelog, and the store opens sound.
func TestOpenEmptiesAStoreLeftUnsynced(t *testing.T) {
	ingestEveryBulk(t)
	dir := t.TempDir()
	s, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	put(t, s, 0, 5*hour, &task.State{TaskID: "before", Attempts: 1})

	// the Bulk's files are held unsynced while the store is copied, as the
	// disk would hold it if the machine stopped then
	copied := t.TempDir()
	hold, release := make(chan struct{}), make(chan struct{})
	beforeSync = func() { close(hold); <-release }
	defer func() { beforeSync = nil }()
	b := s.NewBulk(8)
	st := &task.State{TaskID: "restored", Attempts: 2}
	if err := b.PutEncoded(0, nil, st, mustEncode(t, s, st)); err != nil {
		t.Fatal(err)
	}
	if err := b.SetCheckpoint(0, 9); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	<-hold
	if err := os.CopyFS(copied, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	close(release)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// the store closed after the sync: no mark, everything kept
	if _, err := os.Stat(filepath.Join(dir, unsyncedMark)); !os.IsNotExist(err) {
		t.Errorf("unsynced mark after a clean close: %v", err)
	}
	s, err = Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(0, "restored"); err != nil || got == nil || got.Attempts != 2 {
		t.Errorf("after a clean close the restored state is %+v (%v), want it kept", got, err)
	}
	s.Close()

	// the copy taken before the sync: emptied on open
	if _, err := os.Stat(filepath.Join(copied, unsyncedMark)); err != nil {
		t.Fatalf("no unsynced mark while the files were not synced: %v", err)
	}
	c, err := Open(copied, nil)
	if err != nil {
		t.Fatalf("a store left unsynced does not open: %v", err)
	}
	defer c.Close()
	for _, id := range []string{"before", "restored"} {
		if got, err := c.Get(0, id); err != nil || got != nil {
			t.Errorf("task %s in a store left unsynced: %+v (%v), want the store emptied", id, got, err)
		}
	}
	if _, ok, err := c.Checkpoint(0); err != nil || ok {
		t.Errorf("checkpoint in a store left unsynced: %v (%v), want none: the partition restores from the start", ok, err)
	}
	if _, err := os.Stat(filepath.Join(copied, unsyncedMark)); !os.IsNotExist(err) {
		t.Errorf("unsynced mark still there after the store was emptied: %v", err)
	}
	put(t, c, 0, 5*hour, &task.State{TaskID: "after", Attempts: 1})
	if got, err := c.Get(0, "after"); err != nil || got == nil {
		t.Errorf("the emptied store does not take writes: %+v (%v)", got, err)
	}
}

// Guards how a Bulk's sorted writes are split into sstables: every write in
// exactly one run, in order, about n runs, each run within one group (one
// index of one partition: the tables of a Bulk of some partitions overlap
// nothing of the others), and a bloom filter on exactly the runs of task
// states, read by point lookups.
func TestTableRuns(t *testing.T) {
	var ops []bulkOp
	groups := 0
	for _, prefix := range []byte{'c', 'd', 'o', 't', 'x'} {
		for p := range uint32(3) {
			groups++
			for i := range 1000 {
				k := binary.BigEndian.AppendUint32([]byte{prefix, '/'}, p)
				ops = append(ops, bulkOp{key: append(k, strconv.Itoa(10_000+i)...)})
			}
		}
	}
	for _, n := range []int{1, 2, 5, 40} {
		runs := tableRuns(ops, n)
		at := 0
		for _, r := range runs {
			if r.from != at || r.to <= r.from {
				t.Fatalf("n=%d: run %+v after %d writes, want one from %d", n, r, at, at)
			}
			g := groupOf(ops[r.from].key)
			for _, op := range ops[r.from:r.to] {
				if point := op.key[0] == 't'; point != r.filtered {
					t.Fatalf("n=%d: key %q in a run with filter %v", n, op.key, r.filtered)
				}
				if !bytes.Equal(groupOf(op.key), g) {
					t.Fatalf("n=%d: run %+v spans groups %q and %q", n, r, g, groupOf(op.key))
				}
			}
			at = r.to
		}
		if at != len(ops) {
			t.Fatalf("n=%d: runs end at %d of %d writes", n, at, len(ops))
		}
		if len(runs) > n+groups {
			t.Errorf("n=%d: %d runs, want at most %d", n, len(runs), n+groups)
		}
	}
}
