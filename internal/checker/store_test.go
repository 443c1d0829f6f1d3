package checker

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/store"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// storeWorld is a changelog partition and the stores written against it.
type storeWorld struct {
	t *testing.T
	c *codec.Codec
}

func newStoreWorld(t *testing.T) *storeWorld {
	c, err := codec.New()
	if err != nil {
		t.Fatal(err)
	}
	return &storeWorld{t: t, c: c}
}

func (w *storeWorld) state(id string, attempts int32, pending bool) *task.State {
	st := &task.State{TaskID: id, Attempts: attempts, LastSeenAt: 1_000, ExpiresAt: 90_000}
	if pending {
		st.Pending = &task.PendingRetry{N: 1, DelayMs: 1000, NotBefore: 2_000}
	}
	return st
}

func (w *storeWorld) encode(st *task.State) []byte {
	v, err := w.c.EncodeState(nil, st)
	if err != nil {
		w.t.Fatal(err)
	}
	return v
}

// rec is a changelog record: a state, or a tombstone when st is nil.
func (w *storeWorld) rec(p int32, off int64, id string, st *task.State) *kgo.Record {
	r := &kgo.Record{Topic: "state", Partition: p, Offset: off, Key: []byte(id)}
	if st != nil {
		r.Value = w.encode(st)
	}
	return r
}

// storePart is what a store holds of one partition.
type storePart struct {
	states     []*task.State
	checkpoint int64 // -1: none
	released   int64 // -1: none
}

// write writes a store with internal/store, as the router does, and closes it.
func (w *storeWorld) write(parts map[int32]storePart) string {
	dir := w.t.TempDir()
	s, err := store.Open(dir, nil)
	if err != nil {
		w.t.Fatal(err)
	}
	b := s.NewBatch()
	for p, sp := range parts {
		for _, st := range sp.states {
			if err := b.PutEncoded(p, nil, st, w.encode(st)); err != nil {
				w.t.Fatal(err)
			}
		}
		if sp.checkpoint >= 0 {
			if err := b.SetCheckpoint(p, sp.checkpoint); err != nil {
				w.t.Fatal(err)
			}
		}
	}
	if err := b.Commit(); err != nil {
		w.t.Fatal(err)
	}
	for p, sp := range parts {
		if sp.released >= 0 {
			if err := s.SetReleased(p, store.Release{End: sp.released, At: time.Now()}); err != nil {
				w.t.Fatal(err)
			}
		}
	}
	if err := s.Close(); err != nil {
		w.t.Fatal(err)
	}
	return dir
}

func (w *storeWorld) check(dir string, log Changelog) *StoreReport {
	rep, err := CheckStore("a", dir, log)
	if err != nil {
		w.t.Fatal(err)
	}
	return rep
}

// Guards the store check's contract: a store that holds exactly what the
// changelog says below its checkpoint passes, and one corrupt, missing or
// extra task state, or states without a checkpoint, are each reported with
// the instance, partition and task; a partition released at the changelog's
// end is compared with the records from its checkpoint applied.
func TestCheckStore(t *testing.T) {
	w := newStoreWorld(t)
	// partition 0: t-1 twice, t-2 once, t-3 written then deleted; a
	// transaction marker at offset 2 and at 6
	log := Changelog{
		Records: []*kgo.Record{
			w.rec(0, 0, "t-1", w.state("t-1", 1, false)),
			w.rec(0, 1, "t-2", w.state("t-2", 1, false)),
			w.rec(0, 3, "t-1", w.state("t-1", 2, true)),
			w.rec(0, 4, "t-3", w.state("t-3", 1, false)),
			w.rec(0, 5, "t-3", nil),
		},
		Ends: map[int32]int64{0: 7},
	}
	good := []*task.State{w.state("t-1", 2, true), w.state("t-2", 1, false)}

	cases := []struct {
		name   string
		part   storePart
		kind   string // the one mismatch wanted, "" for none
		task   string
		detail string
	}{
		{name: "consistent, current", part: storePart{states: good, checkpoint: 6, released: 7}},
		{name: "consistent, not current", part: storePart{states: good, checkpoint: 6, released: -1}},
		{name: "current, records from the checkpoint applied",
			part: storePart{states: []*task.State{w.state("t-1", 2, true), w.state("t-2", 1, false)}, checkpoint: 4, released: 7}},
		{name: "different attempts", part: storePart{states: []*task.State{w.state("t-1", 3, true), good[1]}, checkpoint: 6, released: 7},
			kind: "different", task: "t-1", detail: "attempts: store 3, changelog 2"},
		{name: "different pending", part: storePart{states: []*task.State{w.state("t-1", 2, false), good[1]}, checkpoint: 6, released: -1},
			kind: "different", task: "t-1", detail: "pending: store none"},
		{name: "missing", part: storePart{states: good[:1], checkpoint: 6, released: 7}, kind: "missing", task: "t-2"},
		{name: "extra after a tombstone", part: storePart{states: append([]*task.State{w.state("t-3", 1, false)}, good...), checkpoint: 6, released: 7},
			kind: "extra", task: "t-3", detail: "tombstone at offset 5"},
		{name: "extra, never written", part: storePart{states: append([]*task.State{w.state("t-9", 1, false)}, good...), checkpoint: 6, released: 7},
			kind: "extra", task: "t-9"},
		{name: "behind its checkpoint", part: storePart{states: []*task.State{w.state("t-1", 1, false), good[1]}, checkpoint: 6, released: -1},
			kind: "different", task: "t-1"},
		{name: "no checkpoint", part: storePart{states: good, checkpoint: -1, released: 7}, kind: "checkpoint"},
		{name: "checkpoint past the end", part: storePart{states: good, checkpoint: 9, released: -1}, kind: "checkpoint"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rep := w.check(w.write(map[int32]storePart{0: tc.part}), log)
			if tc.kind == "" {
				if len(rep.Mismatches) > 0 {
					t.Fatalf("mismatches in a consistent store: %v", rep.Mismatches)
				}
				if rep.Partitions[0].Compared == 0 {
					t.Fatalf("nothing compared: %s", rep.Summary())
				}
				return
			}
			var found []StoreMismatch
			for _, m := range rep.Mismatches {
				if m.Kind == tc.kind && m.TaskID == tc.task && m.Partition == 0 && m.Instance == "a" && strings.Contains(m.Detail, tc.detail) {
					found = append(found, m)
				}
			}
			if len(found) != 1 || (tc.kind != "checkpoint" && len(rep.Mismatches) != 1) {
				t.Fatalf("want one %s mismatch of task %q (%q), got %v", tc.kind, tc.task, tc.detail, rep.Mismatches)
			}
			t.Logf("reported: %s", found[0])
		})
	}
}

// Guards the store check against compaction: in a partition the router
// wipes before using it again, a task whose records below the checkpoint
// the cleaner dropped (a later record of it replaced them) is not compared,
// while a task the compacted changelog still tells below the checkpoint is.
func TestCheckStoreCompactedBelowCheckpoint(t *testing.T) {
	w := newStoreWorld(t)
	// t-4's record at offset 0 was dropped by the cleaner: its later one
	// (at 4, past the store's checkpoint 3) replaced it; t-6 was deleted
	// past the checkpoint, and the cleaner dropped its records and tombstone
	log := Changelog{
		Records: []*kgo.Record{
			w.rec(1, 1, "t-5", w.state("t-5", 1, false)),
			w.rec(1, 4, "t-4", w.state("t-4", 2, false)),
		},
		Ends: map[int32]int64{1: 6},
	}
	stale := []*task.State{w.state("t-4", 1, false), w.state("t-5", 1, false), w.state("t-6", 1, false)}
	rep := w.check(w.write(map[int32]storePart{1: {states: stale, checkpoint: 3, released: 2}}), log)
	if len(rep.Mismatches) > 0 {
		t.Fatalf("mismatches where compaction left nothing to compare: %v", rep.Mismatches)
	}
	if p := rep.Partitions[0]; p.Current || p.Compared != 1 || p.Untold != 2 {
		t.Fatalf("want t-5 compared and t-4, t-6 untold, in a partition not current: %+v", p)
	}
	stale[1] = w.state("t-5", 7, false)
	rep = w.check(w.write(map[int32]storePart{1: {states: stale, checkpoint: 3, released: 2}}), log)
	if len(rep.Mismatches) != 1 || rep.Mismatches[0].TaskID != "t-5" || rep.Mismatches[0].Kind != "different" {
		t.Fatalf("want t-5 reported different, got %v", rep.Mismatches)
	}
}

// Guards what the store check leaves alone: a store the router empties
// when it opens it (the unsynced mark of a restore) is not compared.
func TestCheckStoreSkipsUnsynced(t *testing.T) {
	w := newStoreWorld(t)
	dir := w.write(map[int32]storePart{0: {states: []*task.State{w.state("t-1", 1, false)}, checkpoint: -1, released: -1}})
	if err := os.WriteFile(filepath.Join(dir, storeUnsynced), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	rep := w.check(dir, Changelog{Ends: map[int32]int64{0: 0}})
	if rep.Skipped == "" || len(rep.Mismatches) > 0 {
		t.Fatalf("a store with the unsynced mark was compared: %+v", rep)
	}
}
