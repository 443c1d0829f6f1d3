package store

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/sstable/block"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/faultrouter/faultrouter/pkg/task"
)

// Bulk collects many writes (a restore's) and applies them at once as
// sstables ingested into Pebble: sorted, written to files and linked into
// the LSM, without the write-ahead log, the memtable and its flush, which
// a Batch pays for every write. It has the same write methods as Batch and
// is as atomic: a Commit applies all of its writes or none; a later write
// of a key, in the same Bulk, replaces an earlier one.
//
// Use it for writes in bulk only: every Commit adds files to the LSM. Files
// that overlap nothing the store holds (a restore of whole partitions into
// a wiped store) go to Pebble's last level; others go above what they
// overlap, and Pebble compacts them in the background.
type Bulk struct {
	s       *Store
	ops     []bulkOp
	arena   []byte     // the keys it built, in chunks: what is appended stays put
	chunks  [][]byte   // the arena's chunks, released after Commit
	spans   [][2]int32 // the order of the writes before ordered (Order)
	ordered int
}

type bulkOp struct {
	key, value []byte
	seq        int // the order of the writes of one key
	del        bool
}

// NewBulk returns an empty Bulk with room for about n writes.
func (s *Store) NewBulk(n int) *Bulk { return &Bulk{s: s, ops: getOps(n)} }

// The memory of committed Bulks is kept for the next ones: a restore writes
// one window after another, and the garbage collector, relaxed while it
// runs, would not hand freed memory back to it; fresh memory costs a page
// fault every 4 KiB, a fifth of a restore's CPU. The pools hold write
// lists, the chunks of key arenas and file write buffers.
var (
	opsPool, chunkPool, writeBufPool sync.Pool
)

const arenaChunk = 256 << 10

// getOps returns an empty write list with room for n writes.
func getOps(n int) []bulkOp {
	if p, ok := opsPool.Get().(*[]bulkOp); ok && cap(*p) >= n {
		return (*p)[:0]
	}
	return make([]bulkOp, 0, n)
}

// putOps hands ops back for reuse, holding no keys or values.
func putOps(ops []bulkOp) {
	ops = ops[:cap(ops)]
	clear(ops)
	opsPool.Put(&ops)
}

// getChunk returns an empty arena chunk with room for n bytes.
func getChunk(n int) []byte {
	if n <= arenaChunk {
		if p, ok := chunkPool.Get().(*[]byte); ok {
			return (*p)[:0]
		}
	}
	return make([]byte, 0, max(n, arenaChunk))
}

// release hands the Bulk's memory back once its writes are in sstables.
func (b *Bulk) release() {
	for _, c := range b.chunks {
		if cap(c) == arenaChunk {
			chunkPool.Put(&c)
		}
	}
	b.chunks, b.arena = nil, nil
	if b.ops != nil {
		putOps(b.ops)
		b.ops = nil
	}
}

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

// keyBuf is the writer method: an empty slice of the arena with room for n
// bytes, which the keys it is appended to keep.
func (b *Bulk) bucket(ms int64) int64 { return ms / b.s.bucketMs }

func (b *Bulk) keyBuf(n int) []byte {
	if cap(b.arena)-len(b.arena) < n {
		b.arena = getChunk(n)
		b.chunks = append(b.chunks, b.arena)
	}
	at := len(b.arena)
	b.arena = b.arena[:at+n]
	return b.arena[at : at : at+n]
}

// PutEncoded is Batch.PutEncoded; v is kept, not copied, until Commit.
func (b *Bulk) PutEncoded(p int32, old, st *task.State, v []byte) error {
	return putEncoded(b, p, old, st, v)
}

// PutIndexed writes the encoded state v of task id, of partition p, with
// the index entries x, replacing the entries old of the state the store
// held (nil for none). id and v are kept, not copied, until Commit.
func (b *Bulk) PutIndexed(p int32, id []byte, old *Entries, x Entries, v []byte) error {
	return putIndexed(b, p, id, old, x, v)
}

// Delete removes a task and its index entries, as Batch.Delete.
func (b *Bulk) DeleteTask(p int32, old *task.State) error { return deleteTask(b, p, old) }

// DeleteIndexed removes task id, of partition p, and the index entries old
// of the state the store held (nil: nothing to remove).
func (b *Bulk) DeleteIndexed(p int32, id []byte, old *Entries) error {
	return deleteIndexed(b, p, id, old)
}

// Order keeps the writes in spans (each a from..to range of writes
// numbered as Len counts them), in the order of spans, followed by the
// writes made after Order; the other writes are discarded. Writes made in task ID order come mostly sorted to Commit, which
// then sorts each index in about linear time: a restore builds its writes
// in the order it reads them, sorts its tasks once and orders the writes
// by them.
func (b *Bulk) Order(spans [][2]int32) { b.spans, b.ordered = spans, len(b.ops) }

// SetCheckpoint is Batch.SetCheckpoint.
func (b *Bulk) SetCheckpoint(p int32, next int64) error {
	return b.Set(checkpointKey(p), binary.BigEndian.AppendUint64(nil, uint64(next)), nil)
}

// Len is the number of writes in the bulk.
func (b *Bulk) Len() int { return len(b.ops) }

var bulkFiles atomic.Int64

// Commit applies the writes: it sorts them (the last write of a key wins),
// writes them to sstables in the store's directory, one per core over
// consecutive key ranges, and ingests them at once. On failure nothing is
// applied.
//
// The files are synced after Commit returns, in the background (see
// unsyncedMark): the store is a cache of the changelog, and a restore
// should not wait for the disk.
//
// A Bulk of fewer than smallBulk writes is applied as one Pebble batch
// instead, as atomic and as the router's own writes are (in the memtable,
// not synced): an ingestion syncs its mark file, the directory and
// Pebble's manifest, a fixed cost that the catch-up of a partition handed
// back in a rebalance, a few records, paid in full (1.7 ms against 1.4 for
// a batch of 700 tasks on a disk whose syncs are quick; more where they
// are slow).
func (b *Bulk) Commit() error {
	defer b.release()
	if b.sort() == 0 {
		return nil
	}
	ops := b.ops[:0] // the last write of each key
	for i, op := range b.ops {
		if i+1 < len(b.ops) && bytes.Equal(op.key, b.ops[i+1].key) {
			continue // a later write of the key replaces this one
		}
		ops = append(ops, op)
	}
	if len(ops) < smallBulk {
		return b.commitBatch(ops)
	}
	marked := make(chan error, 1)
	go func() { marked <- b.s.markUnsynced() }()
	runs := tableRuns(ops, min(runtime.GOMAXPROCS(0), 1+len(ops)/10_000))
	paths := make([]string, len(runs))
	files := make([]vfs.File, len(runs))
	errs := make([]error, len(runs))
	onEveryCore(len(runs), func(k int) {
		r := runs[k]
		paths[k] = filepath.Join(b.s.dir, fmt.Sprintf("bulk-%d.sst.tmp", bulkFiles.Add(1)))
		files[k], errs[k] = b.s.writeTable(paths[k], ops[r.from:r.to], r.filtered)
	})
	err := errors.Join(errs...)
	if merr := <-marked; err == nil {
		err = merr
	}
	if err == nil {
		err = b.s.db.Ingest(context.Background(), paths)
		b.s.resetFloors() // its index entries are not tracked: scans start over
	}
	if err != nil {
		for k, path := range paths {
			if files[k] != nil {
				_ = files[k].Close()
			}
			if path != "" {
				_ = b.s.opts.FS.Remove(path)
			}
		}
		b.s.synced(nil)
		return b.s.check(fmt.Errorf("store: bulk write: %w", err))
	}
	b.s.syncs.Add(1)
	go func() {
		defer b.s.syncs.Done()
		b.s.synced(files)
	}()
	return nil
}

// smallBulk is the number of writes under which a Bulk is applied as a
// Pebble batch rather than ingested (Commit): a few thousand task states,
// a batch of a few MiB, well within a memtable.
var smallBulk = 20_000 // a variable for tests

// commitBatch applies the sorted writes ops as one Pebble batch.
func (b *Bulk) commitBatch(ops []bulkOp) error {
	wb := b.s.db.NewBatch()
	defer wb.Close()
	var err error
	for _, op := range ops {
		if op.del {
			err = wb.Delete(op.key, nil)
		} else {
			err = wb.Set(op.key, op.value, nil)
		}
		if err != nil {
			return fmt.Errorf("store: bulk write: %w", err)
		}
	}
	if err := wb.Commit(pebble.NoSync); err != nil {
		return fmt.Errorf("store: bulk write: %w", err)
	}
	b.s.resetFloors() // its index entries are not tracked: scans start over
	return nil
}

// unsyncedMark is a file in the store's directory that is there while
// sstables linked into the store may not be on disk: from before a Bulk
// ingests its files, which it writes without syncing them, until they are
// synced. Open empties a store that has it (the machine stopped before the
// files were on disk; a restore fills the store again from the changelog).
const unsyncedMark = "UNSYNCED"

// beforeSync, in tests, runs before a committed Bulk's files are synced.
var beforeSync func()

// markUnsynced counts one more Bulk whose files are not synced, creating
// the mark (synced, with the directory) for the first.
func (s *Store) markUnsynced() error {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	s.syncing++
	if s.syncing > 1 {
		return nil
	}
	f, err := s.opts.FS.Create(filepath.Join(s.dir, unsyncedMark), vfs.WriteCategoryUnspecified)
	if err == nil {
		err = errors.Join(f.Sync(), f.Close())
	}
	if err == nil {
		err = syncDir(s.dir)
	}
	return err
}

// synced syncs and closes the files of a committed Bulk (none for one that
// failed), then counts the Bulk done, removing the mark after the last.
func (s *Store) synced(files []vfs.File) {
	if files != nil && beforeSync != nil {
		beforeSync()
	}
	var err error
	for _, f := range files {
		err = errors.Join(err, f.Sync(), f.Close())
	}
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	s.syncing--
	if err != nil {
		// the mark stays: the next Open empties the store
		s.log.Warn("restored state not synced to disk; it is restored again from the changelog on the next start", "err", err)
		return
	}
	if s.syncing == 0 {
		if err := s.opts.FS.Remove(filepath.Join(s.dir, unsyncedMark)); err == nil {
			_ = syncDir(s.dir)
		}
	}
}

// dropUnsynced empties the store in dir if it has the unsynced mark.
func dropUnsynced(dir string, log *slog.Logger) error {
	if _, err := os.Stat(filepath.Join(dir, unsyncedMark)); err != nil {
		return nil // no mark (or no directory yet)
	}
	log.Warn("the store was left before its restored state was synced to disk; emptying it: it is restored from the changelog", "dir", dir)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("store: empty %s: %w", dir, err)
	}
	for _, e := range entries {
		if e.Name() == unsyncedMark {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("store: empty %s: %w", dir, err)
		}
	}
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("store: empty %s: %w", dir, err)
	}
	// the mark goes last: a crash in the middle empties the store again
	if err := os.Remove(filepath.Join(dir, unsyncedMark)); err != nil {
		return fmt.Errorf("store: empty %s: %w", dir, err)
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := vfs.Default.OpenDir(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}

// tableRun is a range of a Bulk's sorted writes that goes to one sstable.
type tableRun struct {
	from, to int
	filtered bool // with a bloom filter
}

// tableRuns splits sorted writes into about n runs of about the same number
// of writes, for sstables written at once, and at the bounds of the groups
// (an index of one partition, see groupOf): a table spans one group's keys
// only, so that the tables of a Bulk of some partitions overlap nothing of
// the others, and Pebble puts them in its last level. Only the tables of
// task states, read by point lookups, get a bloom filter: the indexes are
// only scanned, and a filter of their keys, a hash of each, would cost
// without use.
func tableRuns(ops []bulkOp, n int) []tableRun {
	pointRead := func(op bulkOp) bool { return op.key[0] == 't' }
	size := max(1, (len(ops)+n-1)/n)
	var runs []tableRun
	from := 0
	for i := 1; i <= len(ops); i++ {
		if i == len(ops) || i-from >= size || !bytes.Equal(groupOf(ops[i].key), groupOf(ops[i-1].key)) {
			runs = append(runs, tableRun{from: from, to: i, filtered: pointRead(ops[from])})
			from = i
		}
	}
	return runs
}

// writeTable writes ops, sorted with unique keys, to an sstable at path,
// with a bloom filter if filtered, and returns the file, open and not
// synced.
func (s *Store) writeTable(path string, ops []bulkOp, filtered bool) (vfs.File, error) {
	f, err := s.opts.FS.Create(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		return nil, err
	}
	// the row-block format of Pebble 1.x: about a third cheaper to write
	// than the columnar one (Pebble reads both; compactions rewrite the
	// file in the store's own format)
	wo := s.opts.MakeWriterOptions(0, sstable.TableFormatPebblev4)
	// not compressed: the restore writes it once and it is read from
	// memory while it is hot
	wo.Compression = block.NoCompression
	if !filtered {
		wo.FilterPolicy = pebble.NoFilterPolicy
	}
	buf, ok := writeBufPool.Get().(*[]byte)
	if !ok {
		b := make([]byte, 0, 1<<20)
		buf = &b
	}
	defer writeBufPool.Put(buf)
	w := sstable.NewWriter(&bufferedWritable{f: f, buf: (*buf)[:0]}, wo)
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
	// Close writes the rest (Finish: not synced, left open)
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

// bufferedWritable writes a file in 1 MiB writes: the sstable writer
// writes each block (4 KiB) as it is done, a system call each.
type bufferedWritable struct {
	f   vfs.File
	buf []byte
	err error
}

func (w *bufferedWritable) Write(p []byte) error {
	if w.err != nil {
		return w.err
	}
	if len(w.buf)+len(p) > cap(w.buf) {
		w.flush()
	}
	if len(p) >= cap(w.buf) {
		if _, err := w.f.Write(p); err != nil && w.err == nil {
			w.err = err
		}
		return w.err
	}
	w.buf = append(w.buf, p...)
	return w.err
}

func (w *bufferedWritable) flush() {
	if len(w.buf) > 0 && w.err == nil {
		_, w.err = w.f.Write(w.buf)
	}
	w.buf = w.buf[:0]
}

// Finish writes the rest; the caller syncs and closes the file.
func (w *bufferedWritable) Finish() error {
	w.flush()
	return w.err
}

func (w *bufferedWritable) Abort() { _ = w.f.Close() }

// sort sorts the writes kept by key, a key's writes in the order they were
// made, and returns how many there are.
// Keys are grouped first by their prefix and partition (the index a key
// belongs to), keeping their order (a counting sort into one new slice),
// and each group is sorted on its own: a caller that writes its tasks in
// task ID order hands over groups that are mostly sorted already, which
// pdqsort checks in linear time.
func (b *Bulk) sort() int {
	// the writes kept, in their order (Order)
	idx := make([]int32, 0, len(b.ops))
	from := 0 // the writes after Order, or all of them
	if b.spans != nil {
		for _, sp := range b.spans {
			for i := sp[0]; i < sp[1]; i++ {
				idx = append(idx, i)
			}
		}
		from = b.ordered
	}
	for i := from; i < len(b.ops); i++ {
		idx = append(idx, int32(i))
	}
	// the group of each write, and the size of each group; a map lookup
	// by string(bytes) does not allocate, and there are a few dozen groups
	ids := map[string]int{}
	var names []string
	var counts []int
	of := make([]int32, len(idx))
	for j, i := range idx {
		g := groupOf(b.ops[i].key)
		id, ok := ids[string(g)]
		if !ok {
			id = len(names)
			names = append(names, string(g))
			ids[names[id]] = id
			counts = append(counts, 0)
		}
		of[j] = int32(id)
		counts[id]++
	}
	order := make([]int, len(names))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(x, y int) int { return cmp.Compare(names[x], names[y]) })
	starts := make([]int, len(names))
	total := 0
	for _, id := range order {
		starts[id] = total
		total += counts[id]
	}
	out := getOps(len(idx))[:len(idx)]
	at := slices.Clone(starts)
	for j, i := range idx {
		out[at[of[j]]] = b.ops[i]
		at[of[j]]++
	}
	// the groups are sorted on every core, the largest first
	bySize := make([]int, len(names))
	for i := range bySize {
		bySize[i] = i
	}
	slices.SortFunc(bySize, func(x, y int) int { return cmp.Compare(counts[y], counts[x]) })
	onEveryCore(len(bySize), func(i int) {
		id := bySize[i]
		slices.SortFunc(out[starts[id]:starts[id]+counts[id]], func(x, y bulkOp) int {
			if c := bytes.Compare(x.key, y.key); c != 0 {
				return c
			}
			return cmp.Compare(x.seq, y.seq)
		})
	})
	putOps(b.ops)
	b.ops, b.spans = out, nil
	return len(out)
}

// onEveryCore calls fn(0), ..., fn(n-1), on one goroutine a core, each
// taking the next job as it is done, and returns when all are done.
func onEveryCore(n int, fn func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				fn(i)
			}
		}()
	}
	wg.Wait()
}

// groupOf is the prefix of key that names its index: the key's kind, and
// the partition for the per-partition kinds. Every key of a group sorts
// after every key of a group whose name sorts before.
func groupOf(key []byte) []byte {
	if len(key) >= 6 && key[1] == '/' {
		return key[:6]
	}
	return key[:min(len(key), 2)]
}
