package store

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/objstorage/objstorageprovider"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/sstable/block"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/faultrouter/faultrouter/pkg/task"
)

// Bulk collects many writes (a restore's) and applies them at once as one
// sstable ingested into Pebble: sorted, written to a file and linked into
// the LSM, without the write-ahead log, the memtable and its flush, which
// a Batch pays for every write. It has the same write methods as Batch and
// is as atomic: a Commit applies all of its writes or none; a later write
// of a key, in the same Bulk, replaces an earlier one.
//
// Use it for writes in bulk only: every Commit adds a file to Pebble's
// level 0 (compacted in the background).
type Bulk struct {
	s   *Store
	ops []bulkOp
}

type bulkOp struct {
	key, value []byte
	seq        int // the order of the writes of one key
	del        bool
}

// NewBulk returns an empty Bulk with room for about n writes.
func (s *Store) NewBulk(n int) *Bulk { return &Bulk{s: s, ops: make([]bulkOp, 0, n)} }

// Set is the writer method: value is kept, not copied, until Commit.
func (b *Bulk) Set(key, value []byte, _ *pebble.WriteOptions) error {
	b.ops = append(b.ops, bulkOp{key: key, value: value, seq: len(b.ops)})
	return nil
}

// Delete is the writer method.
func (b *Bulk) Delete(key []byte, _ *pebble.WriteOptions) error {
	b.ops = append(b.ops, bulkOp{key: key, del: true, seq: len(b.ops)})
	return nil
}

// PutEncoded is Batch.PutEncoded; v is kept, not copied, until Commit.
func (b *Bulk) PutEncoded(p int32, old, st *task.State, v []byte) error {
	return putEncoded(b, p, old, st, v)
}

// Delete removes a task and its index entries, as Batch.Delete.
func (b *Bulk) DeleteTask(p int32, old *task.State) error { return deleteTask(b, p, old) }

// SetCheckpoint is Batch.SetCheckpoint.
func (b *Bulk) SetCheckpoint(p int32, next int64) error {
	return b.Set(checkpointKey(p), binary.BigEndian.AppendUint64(nil, uint64(next)), nil)
}

// Len is the number of writes in the bulk.
func (b *Bulk) Len() int { return len(b.ops) }

var bulkFiles atomic.Int64

// Commit applies the writes: it sorts them (the last write of a key wins),
// writes them to sstables in the store's directory, synced, one per core
// over consecutive key ranges, and ingests them at once. On failure nothing
// is applied.
func (b *Bulk) Commit() error {
	if len(b.ops) == 0 {
		return nil
	}
	b.sort()
	ops := b.ops[:0] // the last write of each key
	for i, op := range b.ops {
		if i+1 < len(b.ops) && bytes.Equal(op.key, b.ops[i+1].key) {
			continue // a later write of the key replaces this one
		}
		ops = append(ops, op)
	}
	b.ops = nil
	n := min(runtime.GOMAXPROCS(0), 1+len(ops)/10_000)
	paths := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for k := range n {
		paths[k] = filepath.Join(b.s.dir, fmt.Sprintf("bulk-%d.sst.tmp", bulkFiles.Add(1)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[k] = b.s.writeTable(paths[k], ops[k*len(ops)/n:(k+1)*len(ops)/n])
		}()
	}
	wg.Wait()
	err := errors.Join(errs...)
	if err == nil {
		err = b.s.db.Ingest(context.Background(), paths)
		b.s.resetFloors() // its index entries are not tracked: scans start over
	}
	if err != nil {
		for _, path := range paths {
			_ = vfs.Default.Remove(path)
		}
		return fmt.Errorf("store: bulk write: %w", err)
	}
	return nil
}

// writeTable writes ops, sorted with unique keys, to an sstable at path.
func (s *Store) writeTable(path string, ops []bulkOp) error {
	f, err := vfs.Default.Create(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	wo := s.opts.MakeWriterOptions(0, s.db.TableFormat())
	// not compressed: the file is soon compacted, which compresses
	wo.Compression = block.NoCompression
	w := sstable.NewWriter(objstorageprovider.NewFileWritable(f), wo)
	for _, op := range ops {
		if op.del {
			err = w.Delete(op.key)
		} else {
			err = w.Set(op.key, op.value)
		}
		if err != nil {
			break
		}
	}
	// Close writes the rest, syncs and closes the file: Pebble requires
	// an ingested file on disk before it names it in its manifest
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	return err
}

// sort sorts the writes by key, a key's writes in the order they were made.
// Keys are grouped first by their prefix and partition (the index a key
// belongs to), keeping their order (a counting sort into one new slice),
// and each group is sorted on its own: a caller that writes its tasks in
// task ID order hands over groups that are mostly sorted already, which
// pdqsort checks in linear time.
func (b *Bulk) sort() {
	// the group of each write, and the size of each group; a map lookup
	// by string(bytes) does not allocate, and there are a few dozen groups
	ids := map[string]int{}
	var names []string
	var counts []int
	of := make([]int32, len(b.ops))
	for i, op := range b.ops {
		g := groupOf(op.key)
		id, ok := ids[string(g)]
		if !ok {
			id = len(names)
			names = append(names, string(g))
			ids[names[id]] = id
			counts = append(counts, 0)
		}
		of[i] = int32(id)
		counts[id]++
	}
	order := make([]int, len(names))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(x, y int) int { return cmp.Compare(names[x], names[y]) })
	starts := make([]int, len(names))
	at := 0
	for _, id := range order {
		starts[id] = at
		at += counts[id]
	}
	out := make([]bulkOp, len(b.ops))
	next := slices.Clone(starts)
	for i, op := range b.ops {
		out[next[of[i]]] = op
		next[of[i]]++
	}
	for id := range names {
		slices.SortFunc(out[starts[id]:starts[id]+counts[id]], func(x, y bulkOp) int {
			if c := bytes.Compare(x.key, y.key); c != 0 {
				return c
			}
			return cmp.Compare(x.seq, y.seq)
		})
	}
	b.ops = out
}

// groupOf is the prefix of key that names its index: the key's kind, and
// the partition for the per-partition kinds. Every key of a group sorts
// after every key of a group whose name sorts before.
func groupOf(key []byte) []byte {
	if len(key) >= 6 && key[1] == '/' && key[0] != 't' && key[0] != 'r' {
		return key[:6]
	}
	return key[:min(len(key), 2)]
}
