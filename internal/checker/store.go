package checker

// store.go compares a stopped router instance's Pebble state store with the
// state changelog. The store is a cache of the changelog (internal/store):
// for a partition whose checkpoint is at offset N, it holds exactly the
// states of the changelog's records below N, the last record of each task
// kept and a tombstone removing it. A partition the instance released at
// the changelog's end (its release mark) is one the router trusts as it is
// when it gets the partition back, reading only the records from the
// checkpoint on: with the records from its checkpoint applied, such a
// partition must be exactly what a restore from the changelog's start
// builds. A partition the router would wipe before using it again (no
// release mark, or the changelog moved since) is still held to its
// checkpoint, task by task, wherever the compacted changelog still tells
// what its records below the checkpoint were.

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cockroachdb/pebble/v2"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
)

// Changelog is the state changelog as a restore reads it.
type Changelog struct {
	// Records are its records read from each partition's log start to
	// Ends with read_committed (tombstones included), in offset order
	// within each partition.
	Records []*kgo.Record
	// Ends are the partitions' committed ends (last stable offsets) the
	// records were read to.
	Ends map[int32]int64
}

// StoreReport is what CheckStore found in one instance's store.
type StoreReport struct {
	Instance string
	// Skipped tells why the store was not compared (the router empties it
	// when it opens it); empty when it was.
	Skipped    string
	Partitions []StorePartition
	Mismatches []StoreMismatch
}

// StorePartition is one partition of a store, as compared.
type StorePartition struct {
	Partition int32
	// Checkpoint is the next changelog offset the store restores the
	// partition from; HasCheckpoint false when it holds none.
	Checkpoint    int64
	HasCheckpoint bool
	// Released is the changelog end the instance released the partition
	// at; HasReleased false when it holds no release mark.
	Released    int64
	HasReleased bool
	// Current: the release mark is the changelog's end, so the router
	// trusts the partition as it is (compared exactly, with the records
	// from the checkpoint applied); else it is compared up to its
	// checkpoint, for the tasks the compacted changelog tells.
	Current bool
	// Tasks are the task states the store holds of the partition,
	// Compared the tasks compared, and Untold the tasks of the store the
	// compacted changelog no longer tells below the checkpoint (a later
	// record of the task replaced them; not compared).
	Tasks, Compared, Untold int
	// Note is why the partition was not compared, if it was not.
	Note string
}

// StoreMismatch is one difference between a store and the changelog.
type StoreMismatch struct {
	Instance  string
	Partition int32
	// TaskID is the task, empty for a mismatch of the whole partition.
	TaskID string
	// Kind is missing (the changelog has a state the store lacks), extra
	// (the store holds a state the changelog has not or deleted),
	// different (both hold a state, and they differ) or checkpoint.
	Kind   string
	Detail string
}

func (m StoreMismatch) String() string {
	task := ""
	if m.TaskID != "" {
		task = " task " + m.TaskID
	}
	return fmt.Sprintf("instance %s partition %d%s: %s: %s", m.Instance, m.Partition, task, m.Kind, m.Detail)
}

// Summary is one line per partition.
func (r *StoreReport) Summary() string {
	if r.Skipped != "" {
		return fmt.Sprintf("instance %s: not compared: %s", r.Instance, r.Skipped)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "instance %s: %d mismatches", r.Instance, len(r.Mismatches))
	for _, p := range r.Partitions {
		fmt.Fprintf(&b, "\n  partition %d: %d tasks", p.Partition, p.Tasks)
		if p.HasCheckpoint {
			fmt.Fprintf(&b, ", checkpoint %d", p.Checkpoint)
		}
		if p.HasReleased {
			fmt.Fprintf(&b, ", released at %d", p.Released)
		}
		switch {
		case p.Note != "":
			fmt.Fprintf(&b, ": %s", p.Note)
		case p.Current:
			fmt.Fprintf(&b, ": current, %d tasks compared exactly (the deleted ones included)", p.Compared)
		default:
			fmt.Fprintf(&b, ": not current (the router wipes it before using it again), %d tasks compared up to the checkpoint, %d the compacted changelog no longer tells", p.Compared, p.Untold)
		}
	}
	return b.String()
}

// storeLayout is the key layout version of internal/store (its layoutVersion):
// a store of another version is emptied when the router opens it. The
// store's expiry bucket, when not the default, follows it after "/".
const storeLayout = "4"

// storeUnsynced is internal/store's mark of restored sstables not yet
// synced: a store that has it is emptied when the router opens it.
const storeUnsynced = "UNSYNCED"

// CheckStore compares the Pebble store in dir, of a router instance that
// has stopped, with the changelog. It opens the store read-only.
func CheckStore(instance, dir string, log Changelog) (*StoreReport, error) {
	rep := &StoreReport{Instance: instance}
	if _, err := os.Stat(filepath.Join(dir, storeUnsynced)); err == nil {
		rep.Skipped = "it has the unsynced mark (" + storeUnsynced + ")"
		return rep, nil
	}
	st, err := readStore(dir)
	if err != nil {
		return nil, err
	}
	if v := st.layout; v != storeLayout && !strings.HasPrefix(v, storeLayout+"/") {
		rep.Skipped = fmt.Sprintf("its key layout is %q, not %q", v, storeLayout)
		return rep, nil
	}
	c, err := codec.New()
	if err != nil {
		return nil, err
	}
	byPart := map[int32][]*kgo.Record{}
	for _, rec := range log.Records {
		byPart[rec.Partition] = append(byPart[rec.Partition], rec)
	}
	parts := map[int32]bool{}
	for p := range st.states {
		parts[p] = true
	}
	for p := range st.checkpoints {
		parts[p] = true
	}
	for p := range st.corrupt {
		parts[p] = true
	}
	for _, p := range slices.Sorted(maps.Keys(parts)) {
		recs := byPart[p]
		slices.SortStableFunc(recs, func(a, b *kgo.Record) int { return cmp.Compare(a.Offset, b.Offset) })
		sp, ms := checkPartition(c, instance, p, st, recs, log.Ends[p])
		rep.Partitions = append(rep.Partitions, sp)
		rep.Mismatches = append(rep.Mismatches, ms...)
	}
	return rep, nil
}

// checkPartition compares one partition of a store with its changelog
// records.
func checkPartition(c *codec.Codec, instance string, p int32, st *storeContent, recs []*kgo.Record, end int64) (StorePartition, []StoreMismatch) {
	states := st.states[p]
	sp := StorePartition{Partition: p, Tasks: len(states)}
	sp.Checkpoint, sp.HasCheckpoint = st.checkpoints[p]
	sp.Released, sp.HasReleased = st.released[p]
	var ms []StoreMismatch
	bad := func(task, kind, format string, args ...any) {
		ms = append(ms, StoreMismatch{Instance: instance, Partition: p, TaskID: task, Kind: kind, Detail: fmt.Sprintf(format, args...)})
	}
	if n, ok := st.corrupt[p]; ok {
		// the router restores such a partition from the changelog's start
		sp.Note = fmt.Sprintf("its checkpoint is corrupt (%d bytes): the router restores it from the changelog's start", n)
		return sp, nil
	}
	if !sp.HasCheckpoint {
		bad("", "checkpoint", "the store holds %d task states of the partition but no checkpoint: a restore would read the changelog from its start over them", len(states))
		return sp, ms
	}
	n := sp.Checkpoint
	if n > end {
		bad("", "checkpoint", "checkpoint %d is past the changelog's committed end %d", n, end)
	}
	// the last record of each task below the checkpoint, and from it on
	below, after := map[string]*kgo.Record{}, map[string]*kgo.Record{}
	for _, rec := range recs {
		if rec.Offset < n {
			below[string(rec.Key)] = rec
		} else {
			after[string(rec.Key)] = rec
		}
	}
	sp.Current = sp.HasReleased && sp.Released == end && n <= end
	if sp.Current {
		// what the router uses when it gets the partition back: the store,
		// with the records from the checkpoint applied, against what a
		// restore from the changelog's start builds
		got := maps.Clone(states)
		want := map[string]*kgo.Record{}
		for _, rec := range recs {
			want[string(rec.Key)] = rec
			if rec.Offset < n {
				continue
			}
			if rec.Value == nil {
				delete(got, string(rec.Key))
			} else {
				got[string(rec.Key)] = rec.Value
			}
		}
		for _, id := range slices.Sorted(maps.Keys(unionKeys(got, want))) {
			sp.Compared++
			compareTask(c, bad, id, got[id], want[id], after[id] != nil)
		}
		return sp, ms
	}
	// a partition the router wipes before using it again: the store as of
	// its checkpoint. A task whose records below the checkpoint the
	// compacted changelog still has is told by its last one there (the
	// cleaner drops a task's records from the oldest on, so the last below
	// the checkpoint is the last one kept below it); a task the changelog
	// has no record of below it may have had records that a later one
	// replaced (or a later tombstone, itself dropped since).
	for _, id := range slices.Sorted(maps.Keys(unionKeys(states, below))) {
		rec := below[id]
		if rec == nil {
			sp.Untold++
			continue
		}
		sp.Compared++
		compareTask(c, bad, id, states[id], rec, false)
	}
	return sp, ms
}

// compareTask compares the state the store holds of a task (nil: none)
// with the changelog's record of it (nil: none; a tombstone: deleted).
// applied tells that the store's state was brought forward by records from
// the checkpoint on.
func compareTask(c *codec.Codec, bad func(task, kind, format string, args ...any), id string, got []byte, want *kgo.Record, applied bool) {
	how := ""
	if applied {
		how = " (with the changelog's records from the checkpoint on applied)"
	}
	switch {
	case want == nil && got == nil:
	case want == nil:
		bad(id, "extra", "the store holds a state (%s) the changelog has no record of%s", describeState(c, got), how)
	case want.Value == nil && got == nil:
	case want.Value == nil:
		bad(id, "extra", "the store holds a state (%s) that the changelog's tombstone at offset %d deleted%s", describeState(c, got), want.Offset, how)
	case got == nil:
		bad(id, "missing", "the changelog's state at offset %d (%s) is not in the store%s", want.Offset, describeState(c, want.Value), how)
	case bytes.Equal(got, want.Value):
	default:
		diff, err := stateDiff(c, got, want.Value)
		if err != nil {
			bad(id, "different", "the store's state (%d bytes) differs from the changelog's at offset %d (%d bytes)%s: %v", len(got), want.Offset, len(want.Value), how, err)
		} else if diff != "" {
			bad(id, "different", "the store's state differs from the changelog's at offset %d%s: %s", want.Offset, how, diff)
		}
	}
}

// unionKeys is the set of the keys of a and b.
func unionKeys[A, B any](a map[string]A, b map[string]B) map[string]bool {
	u := make(map[string]bool, len(a)+len(b))
	for k := range a {
		u[k] = true
	}
	for k := range b {
		u[k] = true
	}
	return u
}

// describeState names a state by what routing keeps of it.
func describeState(c *codec.Codec, v []byte) string {
	st, err := c.DecodeState(v)
	if err != nil {
		return fmt.Sprintf("%d bytes that do not decode: %v", len(v), err)
	}
	s := fmt.Sprintf("attempts %d, retries %d", st.Attempts, st.Retries)
	if st.Pending != nil {
		b, _ := json.Marshal(st.Pending)
		s += ", pending " + string(b)
	}
	if st.Review != "" {
		s += ", review " + st.Review
	}
	if st.Terminal {
		s += ", terminal"
	}
	return s
}

// stateDiff names the fields in which two encoded states differ ("" when
// they decode to the same state).
func stateDiff(c *codec.Codec, got, want []byte) (string, error) {
	g, err := c.DecodeState(got)
	if err != nil {
		return "", fmt.Errorf("the store's state does not decode: %w", err)
	}
	w, err := c.DecodeState(want)
	if err != nil {
		return "", fmt.Errorf("the changelog's state does not decode: %w", err)
	}
	fields := func(v any) (map[string]json.RawMessage, error) {
		b, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		m := map[string]json.RawMessage{}
		return m, json.Unmarshal(b, &m)
	}
	gm, err := fields(g)
	if err != nil {
		return "", err
	}
	wm, err := fields(w)
	if err != nil {
		return "", err
	}
	var diffs []string
	for _, k := range slices.Sorted(maps.Keys(unionKeys(gm, wm))) {
		if bytes.Equal(gm[k], wm[k]) {
			continue
		}
		diffs = append(diffs, fmt.Sprintf("%s: store %s, changelog %s", k, shorten(gm[k]), shorten(wm[k])))
	}
	return strings.Join(diffs, "; "), nil
}

func shorten(v json.RawMessage) string {
	if v == nil {
		return "none"
	}
	if len(v) > 160 {
		return string(v[:160]) + "..."
	}
	return string(v)
}

// storeContent is what a store holds, by partition.
type storeContent struct {
	layout      string
	states      map[int32]map[string][]byte // t/<partition:4><task_id>
	checkpoints map[int32]int64             // c/<partition:4>
	corrupt     map[int32]int               // checkpoints that are not 8 bytes: their length
	released    map[int32]int64             // e/<partition:4>
}

// readStore reads the task states, checkpoints and release marks of the
// store in dir (internal/store's key layout), read-only.
func readStore(dir string) (*storeContent, error) {
	if _, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("checker: store: %w", err)
	}
	db, err := pebble.Open(dir, &pebble.Options{ReadOnly: true, Logger: quietLogger{}})
	if err != nil {
		return nil, fmt.Errorf("checker: open the store in %s: %w", dir, err)
	}
	defer db.Close()
	st := &storeContent{states: map[int32]map[string][]byte{}, checkpoints: map[int32]int64{},
		corrupt: map[int32]int{}, released: map[int32]int64{}}
	v, closer, err := db.Get([]byte("v"))
	switch {
	case err == nil:
		st.layout = string(v)
		closer.Close()
	case !errors.Is(err, pebble.ErrNotFound):
		return nil, fmt.Errorf("checker: store layout: %w", err)
	}
	it, err := db.NewIter(nil)
	if err != nil {
		return nil, err
	}
	defer it.Close()
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		if len(k) < 6 || k[1] != '/' {
			continue
		}
		p := int32(binary.BigEndian.Uint32(k[2:6]))
		val, err := it.ValueAndErr()
		if err != nil {
			return nil, err
		}
		switch k[0] {
		case 't':
			if st.states[p] == nil {
				st.states[p] = map[string][]byte{}
			}
			st.states[p][string(k[6:])] = slices.Clone(val)
		case 'c':
			if len(k) != 6 {
				continue
			}
			if len(val) != 8 {
				st.corrupt[p] = len(val)
				continue
			}
			st.checkpoints[p] = int64(binary.BigEndian.Uint64(val))
		case 'e':
			if len(k) == 6 && (len(val) == 8 || len(val) == 24) { // the offset, then (if there) the time and checkpoint
				st.released[p] = int64(binary.BigEndian.Uint64(val))
			}
		}
	}
	if err := it.Error(); err != nil {
		return nil, fmt.Errorf("checker: read the store in %s: %w", dir, err)
	}
	return st, nil
}

// quietLogger keeps Pebble's messages about opening a store out of the
// report.
type quietLogger struct{}

func (quietLogger) Infof(string, ...any)      {}
func (quietLogger) Errorf(string, ...any)     {}
func (quietLogger) Fatalf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }
